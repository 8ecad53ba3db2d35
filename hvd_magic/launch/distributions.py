"""Which installed distribution holds a module a job imports: the one whose files (its RECORD)
list the file of the deepest module of that name that can be imported, as the import system
finds it, without importing it. Never by the top-level name alone: a namespace package
(``google``, ``azure``, ``jaraco``, ``zope``, ``backports``, ``sphinxcontrib``) is held by many
distributions (``import google.auth`` is google-auth's, not protobuf's).

Only public APIs of `importlib.metadata` (`Distribution.files`, `locate_file`, `read_text`).

Not for: what ships, with what it requires (`hvd_magic.launch.shipping`).
"""

import hashlib
import importlib.machinery
import importlib.metadata as metadata
import importlib.util
import os
import re
import sys


def normalized(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_of(module):
    """The installed distribution that holds module `module` ("google.auth"): the one whose
    files (its RECORD) list the file of the deepest module of that name that can be imported
    (never by its top-level name alone: google-auth and protobuf both hold ``google``); None for
    the standard library, a namespace package, a module no distribution lists (the notebook's
    own), or one not found. Nothing is imported to find it."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return None
    spec = _deepest(module)
    if spec is None or spec.origin in ("built-in", "frozen"):
        return None
    if spec.has_location and spec.origin:
        found = next((d for d in _candidates(top) if _lists(d, spec.origin)), None)
        if found is not None:
            return found
    elif spec.submodule_search_locations is not None:
        return None  # a namespace package: its portions' distributions, where imported
    # no RECORD lists it: an editable install (its sources elsewhere), or a distribution that
    # does not list its files
    return next((d for d in _candidates(top) if editable(d) and _holds(d, top) or
                 d.files is None), None)


def _deepest(module):
    """The spec of the deepest module of dotted name `module` that can be imported, found as
    the import system would, without importing a package (``torch.nn`` does not import torch)."""
    parts = module.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    for i in range(2, len(parts) + 1):
        name = ".".join(parts[:i])
        where = spec.submodule_search_locations if spec is not None else None
        if not where:
            break
        loaded = sys.modules.get(name)
        try:
            sub = loaded.__spec__ if loaded is not None else _found(name, list(where))
        except (ImportError, ValueError, AttributeError):
            sub = None
        if sub is None:
            break  # (a name in the module: `from google.auth import default`)
        spec = sub
    return spec


def _found(name, where):
    """The spec of module `name` in folders `where` (its package's search locations), by each
    folder's path-entry finder, as the import system would find it; a namespace package's
    portions gathered here (`PathFinder` reads them off its parent module, which must then be
    imported: ``google.cloud`` below an unimported ``google`` is a KeyError there)."""
    portions = []
    for entry in where:
        finder = sys.path_importer_cache.get(entry) or _finder(entry)
        spec = finder.find_spec(name) if hasattr(finder, "find_spec") else None
        if spec is not None and spec.loader is not None:
            return spec
        if spec is not None:
            portions.extend(spec.submodule_search_locations or ())
    if not portions:
        return None
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = portions
    return spec


def _finder(entry):
    """The path-entry finder of folder (or zip) `entry`, from `sys.path_hooks`; None: none."""
    for hook in sys.path_hooks:
        try:
            return hook(entry)
        except ImportError:
            continue
    return None


def _candidates(top):
    """The distributions that may hold top-level module `top`: the one named as it first (most
    are: numpy, psutil), then every one whose top-level names list it."""
    try:
        yield metadata.distribution(top)
    except metadata.PackageNotFoundError:
        pass
    yield from _by_top_level().get(top, ())


def _lists(dist, origin):
    """Whether the files `dist` lists (its RECORD) hold file `origin`: found by its path below
    the folder `dist` is installed in, as found or with links resolved (a venv whose entries
    are links), then the same real file."""
    listing = _listing(dist)
    base = str(dist.locate_file(""))
    target = os.path.realpath(origin)
    for path, root in ((origin, base), (target, os.path.realpath(base))):
        listed = listing.get(os.path.relpath(path, root).replace(os.sep, "/"))
        if listed is not None and os.path.realpath(dist.locate_file(listed)) == target:
            return True
    return False


_listings = {}


def _listing(dist):
    """{path: the file} of the files `dist` lists, read once per content of its RECORD (torch
    lists 15,000 files, read in 0.1 s; a job names torch.nn, torch.optim...)."""
    record = dist.read_text("RECORD")
    key = hashlib.sha256(record.encode()).digest() if record else None
    if key is None or key not in _listings:
        found = {str(f): f for f in dist.files or ()}
        if key is None:
            return found
        _listings[key] = found
    return _listings[key]


_index = {}


def path_key():
    """What changes when a package is installed or removed: each path folder's time."""
    return tuple((p, os.stat(p).st_mtime_ns) for p in sys.path if os.path.isdir(p))


def _by_top_level():
    """{top-level module: [distributions]} of this Python, made again once a folder on the path
    changed (a package installed in the notebook minutes ago is found)."""
    key = path_key()
    if key not in _index:
        _index.clear()
        found = {}
        for dist in metadata.distributions():
            for top in _top_levels(dist):
                found.setdefault(top, []).append(dist)
        _index[key] = found
    return _index[key]


def _top_levels(dist):
    text = dist.read_text("top_level.txt")
    if text:
        return set(text.split())
    return {str(f).split("/")[0].removesuffix(".py") for f in dist.files or ()
            if not str(f).startswith("..")}


def _holds(dist, module):
    return module in _top_levels(dist) or editable(dist) and module == normalized(
        dist.metadata["Name"]).replace("-", "_")


def editable(dist):
    return '"editable":true' in (dist.read_text("direct_url.json") or "").replace(" ", "")
