"""Other libraries' private APIs, one module per library (`compat/torch.py`,
`compat/pyspark.py`...): the only place in hvd_magic that reads another library's ``_names``.

Each private access is feature-detected against the installed version (an attribute looked up,
never assumed); where one is missing the caller degrades as the function's docstring says, and
`unavailable` says so once per process and feature, in one line on stderr that names the
feature, the library's version and what the user loses (on a rank, among the rank's lines). Not
a `logging` record: a handler set up for Horovod's driver (`driver/horovod_log.py`) or by a
framework could drop it, and a feature that stops must never stop in silence. Nor a
`warnings.warn`: two lines (the source line too), and a filter may hide it.

The modules are leaves: they import nothing of hvd_magic but this one, and import their library
only inside a function, where the caller would have imported it anyway (the rank side never
loads pyspark or IPython through here).
"""

import importlib.metadata
import sys
import threading

_said = set()
_said_lock = threading.Lock()


def version_of(library):
    """The installed version of `library` (its module's ``__version__``, else its
    distribution's), or "(version unknown)"."""
    found = getattr(sys.modules.get(library), "__version__", None)
    if found:
        return str(found)
    try:
        return importlib.metadata.version(library)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def unavailable(library, feature, loss, version=None):
    """Say, the first time in this process, that `feature` of `library` is off here and what
    the user loses (e.g. "Flight Recorder unavailable in torch 2.1.0: stall views show Python
    stacks only"). Returns whether it was said now."""
    with _said_lock:
        if (library, feature) in _said:
            return False
        _said.add((library, feature))
    print(f"hvd_magic: {feature} unavailable in {library} {version or version_of(library)}: {loss}",
          file=sys.stderr, flush=True)
    return True


def private(owner, name, library, feature, loss):
    """`owner`'s attribute `name` (one of `library`'s private ones), or None where this version
    has none: then `unavailable(library, feature, loss)` says so once."""
    found = getattr(owner, name, None)
    if found is None:
        unavailable(library, feature, loss)
    return found
