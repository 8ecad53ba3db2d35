"""A user's own environment, made for a test: a new venv with hvd_magic installed from the
project's wheel by pip, and the packages a user would already have, but never Horovod (and,
when asked, never pyspark).

The packages are this sandbox's own (.venv's site-packages, each entry linked into the new
venv's, less the ones left out), so the environment costs seconds, not the minutes and gigabytes
of a download: what is left out is simply not there, as in an environment where it was never
installed. hvd_magic itself is installed by pip from the wheel, with its dependencies checked
against what is there (`--no-index`: nothing fetched), and its console scripts made.
"""

import os
import subprocess
import sys
import sysconfig
import venv

from conftest import ROOT

# never in a user's environment made this way: our own sandbox's copy of the project
OURS = ("hvd_magic", "__editable__", "_hvd_magic", "hvd-magic")


def build_wheel(dest):
    """The project's wheel, built from the checkout by pip as `pip wheel .` would; its path."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(dest), ROOT],
                   check=True, capture_output=True, text=True)
    (wheel,) = [n for n in os.listdir(dest) if n.endswith(".whl")]
    return os.path.join(dest, wheel)


# torch and what it requires, nothing else: an executor's image that has "only Python and torch"
TORCH_ONLY = ("torch", "functorch", "torchgen", "filelock", "fsspec", "jinja2", "markupsafe",
              "mpmath", "networkx", "sympy", "isympy", "typing_extensions", "setuptools",
              "_distutils_hack", "pkg_resources", "distutils")


def make_env(dest, wheel, without=("horovod",), keep=None):
    """A venv at `dest` with this sandbox's packages less `without` (their modules and their
    distributions), or only those named in `keep`, and hvd_magic from `wheel` (None: no
    hvd_magic); the path of its python."""
    dest = str(dest)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(dest)
    python = os.path.join(dest, "bin", "python")
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    theirs = subprocess.run([python, "-c", purelib],
                            check=True, capture_output=True, text=True).stdout.strip()
    ours = sysconfig.get_path("purelib")
    for name in os.listdir(ours):
        top = name.split("-")[0].split(".")[0].lower()
        if name.startswith(OURS) or top in without or name == "__pycache__" or \
                keep is not None and top not in keep:
            continue
        os.symlink(os.path.join(ours, name), os.path.join(theirs, name))
    if wheel is not None:
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", wheel],
                       check=True, capture_output=True, text=True)
    return python


def small_wheel(dest, name, version, body, package=None):
    """A pure-Python distribution `name` (one package, `package` or `name`, whose
    ``__init__.py`` is `body`), built into a wheel by pip from a project made here; the wheel's
    path. A dotted `package` ("nsdemo.alpha") is a portion of a namespace package."""
    package = package or name
    project = os.path.join(dest, f"{name}-{version}-src")
    os.makedirs(os.path.join(project, *package.split(".")))
    with open(os.path.join(project, "pyproject.toml"), "w") as f:
        f.write(f'[build-system]\nrequires = ["setuptools"]\nbuild-backend = '
                f'"setuptools.build_meta"\n[project]\nname = "{name}"\nversion = "{version}"\n'
                f'[tool.setuptools]\npackages = ["{package}"]\n')
    with open(os.path.join(project, *package.split("."), "__init__.py"), "w") as f:
        f.write(body)
    out = os.path.join(dest, f"{name}-{version}-wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", out, project],
                   check=True, capture_output=True, text=True)
    (wheel,) = os.listdir(out)
    return os.path.join(out, wheel)


def install(python_or_target, wheel):
    """`wheel` installed by pip into a venv (its python) or a folder (a path ending in /)."""
    if python_or_target.endswith("/"):
        command = [sys.executable, "-m", "pip", "install", "--target", python_or_target]
    else:
        command = [python_or_target, "-m", "pip", "install"]
    subprocess.run(command + ["--quiet", "--no-index", "--no-deps", wheel],
                   check=True, capture_output=True, text=True)


def compiled_dist(site, name, version, tag):
    """Distribution `name` as a wheel tagged `tag` (e.g. cp311-abi3-manylinux_2_99_x86_64)
    leaves it installed in folder `site`: its package with a compiled module's file, and its
    metadata (no installer would put a wheel for a newer C library here: it is written as one
    would have)."""
    package = os.path.join(site, name)
    info = os.path.join(site, f"{name}-{version}.dist-info")
    os.makedirs(package)
    os.makedirs(info)
    files = {os.path.join(package, "__init__.py"): f"__version__ = {version!r}\n",
             os.path.join(package, "_speed.abi3.so"): "(a compiled module)",
             os.path.join(info, "METADATA"): f"Metadata-Version: 2.1\nName: {name}\n"
                                             f"Version: {version}\n",
             os.path.join(info, "WHEEL"): f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\n"
                                          f"Tag: {tag}\n",
             os.path.join(info, "top_level.txt"): f"{name}\n"}
    for path, text in files.items():
        with open(path, "w") as f:
            f.write(text)
    with open(os.path.join(info, "RECORD"), "w") as f:
        f.writelines(f"{os.path.relpath(p, site)},,\n"
                     for p in [*files, os.path.join(info, "RECORD")])
