"""The optional packages: which of them a Python has, and what to say when a run needs one that
is missing (which package, for what, in which Python, and how to get it).

hvd_magic needs no framework: Horovod, pyspark, torch and TensorFlow are each needed only by what
uses them (a Horovod cell, ``--np N`` on Spark...). Looked up with `importlib.util.find_spec`,
never imported here: asking must not cost a framework's import. Standard library only: the
tasks and ranks use it too.

Not for: raising (the caller picks the error: a `UsageError` before a run, a rank's hint after).
"""

import importlib.machinery
import importlib.util
import os
import re
import sys

# a package -> (what it is called, how to get it)
HOW = {
    "horovod": ("Horovod",
                "`python -m hvd_magic.build_horovod` with that Python (Horovod 0.28.1 with our "
                "patches, built against its torch and TensorFlow: 6-10 minutes). Code without "
                "Horovod needs none of it: torch.distributed (DDP), Lightning, accelerate and "
                "tf.distribute run as they are (%%distributed)"),
    "pyspark": ("pyspark", "`pip install pyspark` there (a local session also needs Java 17)"),
    "torch": ("PyTorch", "`pip install torch` there (or `pip install hvd_magic[torch]`)"),
    "tensorflow": ("TensorFlow", "`pip install tensorflow` there"),
    "lightning": ("Lightning", "`pip install lightning` there"),
    "pytorch_lightning": ("Lightning", "`pip install lightning` there"),
    "accelerate": ("accelerate", "`pip install accelerate` there"),
}


# where the ranks run this very interpreter (--np -N, a local Spark session)
RANKS_HERE = "this notebook's Python, which the ranks run"


def installed(module, first=()):
    """Whether `module`'s top-level package can be imported by this Python, or from the folders
    `first` (a rank's PYTHONPATH: what the notebook shipped to this executor)."""
    top = module.split(".")[0]
    try:
        folders = [f for f in first if f]
        if folders and importlib.machinery.PathFinder.find_spec(top, folders) is not None:
            return True
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def import_error(module):
    """What importing `module` raises in this Python, in one line (``ModuleNotFoundError: No
    module named 'py4j'``), or None: a package that is there but broken (a half-done upgrade, a
    dependency gone, too old for this Python). It imports the module: only for a caller that is
    about to use it anyway."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001  (whatever a broken package raises is the answer)
        return f"{type(exc).__name__}: {exc}"
    return None


def broken_message(package, needed_by, error, python=None):
    """One message: `needed_by` needs `package`, which is installed here but fails to import."""
    name, _ = HOW[package]
    python = os.path.normpath(python or sys.executable)
    return (f"{needed_by} needs {name}, and it fails to import in this notebook's Python "
            f"({python}): {error}. Repair it with that Python: `{python} -m pip install "
            f"--force-reinstall {package}` (it brings what {name} needs).")


def missing_module(error_text):
    """The optional package an ``ImportError``'s message is about (``No module named
    'horovod.torch'`` -> ``"horovod"``), or None."""
    found = re.search(r"No module named '([\w.]+)'", error_text or "")
    top = found.group(1).split(".")[0] if found else None
    return top if top in HOW else None


def missing_message(package, needed_by, where="this notebook's Python", python=None):
    """One message: `needed_by` needs `package`, which `where` (`python`) lacks; how to get it."""
    name, how = HOW[package]
    python = os.path.normpath(python or sys.executable)
    return (f"{needed_by} needs {name}, which is not installed in {where} ({python}). "
            f"To get it: {how}.")
