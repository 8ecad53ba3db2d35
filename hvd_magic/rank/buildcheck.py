"""Say plainly when a rank's Horovod was built against another torch or TensorFlow.

Horovod's compiled parts are tied to the exact torch and TensorFlow they were built against: with
another version, ``import horovod.torch`` (or ``horovod.tensorflow``) fails with an ``undefined
symbol`` from a ``.so`` deep in site-packages, which tells a user nothing. Our Horovod build
(``python -m hvd_magic.build_horovod``) records what it built against in
``horovod/_hvd_magic_build.py``; `explain` turns such an import failure into which versions
differ and how to rebuild.

Read without importing Horovod (and so usable where importing it is what fails), and standard
library only: `hvd_magic.launch.envcheck` reads the same file on every executor.
"""

import ast
import importlib.util
import os
from importlib.metadata import PackageNotFoundError, version

BUILD_FILE = "_hvd_magic_build.py"
# The distributions a framework may be installed as, in the order they are looked for.
DISTRIBUTIONS = {"torch": ("torch",), "tensorflow": ("tensorflow-cpu", "tensorflow")}
REBUILD = ("Rebuild Horovod for the versions installed here: `python -m hvd_magic.build_horovod` "
           "with that environment's Python (`make setup` in an hvd_magic checkout).")


def built_with():
    """{"torch": "2.13.0+cpu", "tensorflow": "2.21.0" or None} as recorded at build time.

    None where Horovod is not installed or was not built by hvd_magic's recipe.
    """
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, BUILD_FILE)
        try:
            with open(path) as f:
                tree = ast.parse(f.read())
        except (OSError, SyntaxError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "BUILT_WITH":
                return ast.literal_eval(node.value)
    return None


def installed(framework):
    """The installed version of "torch" or "tensorflow", from package metadata (no import)."""
    for name in DISTRIBUTIONS[framework]:
        try:
            return version(name)
        except PackageNotFoundError:
            pass
    return None


def mismatches(built=None):
    """[(framework, built against, installed)] for each framework whose versions differ."""
    built = built_with() if built is None else built
    if not built:
        return []
    found = []
    for framework in DISTRIBUTIONS:
        want, have = built.get(framework), installed(framework)
        if want and have and want != have:
            found.append((framework, want, have))
    return found


def explain(exc):
    """A plain message for an import failure caused by the Horovod build, else None."""
    text = str(exc)
    if not isinstance(exc, (ImportError, OSError)):
        return None
    if "has not been built" in text and "horovod." in text:  # Horovod's own words for this
        framework = "TensorFlow" if "tensorflow" in text.split("has not been built")[0] else "torch"
        return (f"Horovod on this rank was built without {framework} (it was not installed when "
                f"Horovod was built). {REBUILD}")
    if "undefined symbol" not in text:
        return None
    found = mismatches()
    if found:
        diffs = "; ".join(f"built against {fw} {want}, but this rank has {fw} {have}"
                          for fw, want, have in found)
        return f"Horovod on this rank was {diffs}, so its compiled part cannot load. {REBUILD}"
    have = ", ".join(f"{fw} {installed(fw)}" for fw in DISTRIBUTIONS if installed(fw))
    return (f"Horovod's compiled part does not fit the frameworks on this rank ({have or 'none'}): "
            f"it was built against other versions. {REBUILD}")


def stale_build(values):
    """For `%horovod_env`: a note per framework whose installed version (``values[name]``) is not
    the one Horovod was built against (``values["horovod_built"]``: "torch 2.13.0, tensorflow ...")."""
    built = dict(part.split(" ", 1) for part in values.get("horovod_built", "").split(", ")
                 if " " in part and part != "not recorded")
    return [f"Horovod was built against {name} {want} but {name} {values.get(name)} is installed, "
            f"so its compiled part cannot load. {REBUILD}"
            for name, want in built.items() if values.get(name, want) not in (want, "missing")]
