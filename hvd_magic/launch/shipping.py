"""What a Spark run ships to executors that may lack it, so that a worker needs only Python and
the frameworks its cells use: hvd_magic itself, what a rank of ours needs (cloudpickle,
psutil), and the distributions the job imports (from its one reading: `capture.reading`), with
what they require, as the notebook's environment has them. The big frameworks (torch,
TensorFlow, Horovod, JAX, pyspark, CUDA's wheels) never go unasked: their builds belong to the
executors' machines, and a mismatch is named as before (`%horovod_env`).

Each distribution is packed once into a zip named by its content's hash (its files as its
metadata lists them: a pure-Python one, or a compiled one, whose parcel says what it was built
for), kept in ``~/.cache/hvd_magic/shipped``, and added to the SparkContext once
(`sc.addPyFile` for hvd_magic, which the Python worker imports to run the task at all;
`sc.addFile` for the rest). Spark brings each file to every executor, a replacement one too;
the task uses what its executor lacks (`hvd_magic.task.shipped`).

Not for: local sessions (their executors run the notebook's own Python: nothing ships), or the
notebook's own modules (sources that travel with the job: `capture.modules`).
"""

import hashlib
import importlib.machinery
import importlib.metadata as metadata
import importlib.util
import os
import platform
import re
import sys
import time
import zipfile

from IPython.core.error import UsageError

from ..compat import importlib_metadata as metadata_compat
from ..task.shipped import Parcel, here
from ..words import plural

OURS = "hvd_magic"
RANK_NEEDS = ("cloudpickle", "psutil")   # what a rank of ours imports (hvd_magic's own needs)
# Never shipped unless named: builds of their own machines (CUDA, compilers), gigabytes.
FRAMEWORKS = {"torch", "torchvision", "torchaudio", "torchtext", "torchdata", "tensorflow",
              "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-keras", "keras",
              "tensorflow-io-gcs-filesystem", "tensorboard", "tensorboard-data-server",
              "horovod", "jax", "jaxlib", "pyspark", "py4j", "triton", "mxnet"}
# What a framework uses without requiring it: torch's object collectives (broadcast_object_list,
# which hvd_magic.elastic's state sync uses) and tensor.numpy() need numpy.
ALSO = {"torch": ("numpy",)}
_BINARY = (".so", ".pyd", ".dylib")
_MANYLINUX = {"manylinux1": "2.5", "manylinux2010": "2.12", "manylinux2014": "2.17"}


def normalized(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def cache_folder():
    return os.path.join(os.path.expanduser("~"), ".cache", "hvd_magic", "shipped")


def _never(name):
    name = normalized(name)
    return name in FRAMEWORKS or name.startswith("nvidia-")


def distribution_of(module):
    """The installed distribution whose files hold top-level `module`; None for the standard
    library, a module no distribution lists (the notebook's own), or one not found."""
    if module in sys.stdlib_module_names or module in sys.builtin_module_names:
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin in ("built-in", "frozen"):
        return None
    try:  # most distributions are named as what they hold (numpy, psutil, cloudpickle)
        dist = metadata.distribution(module)
        if _holds(dist, module):
            return dist
    except metadata.PackageNotFoundError:
        pass
    for dist in _by_top_level().get(module, ()):
        return dist
    return None


_index = {}


def _path_key():
    """What changes when a package is installed or removed: each path folder's time."""
    return tuple((p, os.stat(p).st_mtime_ns) for p in sys.path if os.path.isdir(p))


def _by_top_level():
    """{top-level module: [distributions]} of this Python, made again once a folder on the path
    changed (a package installed in the notebook minutes ago is found)."""
    key = _path_key()
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
    return module in _top_levels(dist) or _editable(dist) and module == normalized(
        dist.metadata["Name"]).replace("-", "_")


def _editable(dist):
    return '"editable":true' in (dist.read_text("direct_url.json") or "").replace(" ", "")


def _requirements(dist):
    """The distributions `dist` requires here (its extras' left out, markers of this Python)."""
    names = []
    for line in dist.requires or ():
        try:
            from packaging.requirements import Requirement
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            names.append(req.name)
        except ImportError:  # (no packaging: the name, and none that an extra asks for)
            if "extra" not in line.partition(";")[2]:
                names.append(re.split(r"[ ;<>=!~\[(]", line.strip(), 1)[0])
        except Exception:  # noqa: BLE001  (a requirement we cannot read: not followed)
            continue
    return names


_chosen = {}


def chosen(imports, only=None):
    """`_chosen_now`, again only once a folder on the path changed."""
    key = (frozenset(name.split(".")[0] for name in imports),
           None if only is None else tuple(only), _path_key())
    if key not in _chosen:
        _chosen.clear()
        _chosen[key] = _chosen_now(key[0], only)
    return _chosen[key]


def _chosen_now(imports, only=None):
    """The distributions a job's ranks get, hvd_magic's first: what its `imports` (module names)
    come from, with everything they require that is installed here, less the frameworks;
    `only` (names) instead of the imports where given."""
    found = {}

    def add(dist, follow=True):
        key = normalized(dist.metadata["Name"])
        if key in found:
            return
        found[key] = dist
        for name in _requirements(dist) if follow else ():
            if not _never(name):
                try:
                    add(metadata.distribution(name))
                except metadata.PackageNotFoundError:
                    pass  # (not installed here: an executor's own may serve; a rank says so)

    add(_ours(), follow=False)
    for name in RANK_NEEDS:
        add(metadata.distribution(name))
    if only is not None:
        for name in only:
            try:
                add(metadata.distribution(name))
            except metadata.PackageNotFoundError:
                raise UsageError(f"--ship {name}: no distribution of that name is installed in "
                                 f"the notebook's Python ({sys.executable}).") from None
        return list(found.values())
    for module in sorted(imports):
        dist = distribution_of(module)
        if dist is not None and not _never(dist.metadata["Name"]) and module != OURS:
            add(dist)
        for name in ALSO.get(module, ()):
            try:
                add(metadata.distribution(name))
            except metadata.PackageNotFoundError:
                pass
    return list(found.values())


class _Unlisted:
    """hvd_magic run from a checkout that pip never installed: its package, no metadata."""
    metadata = {"Name": OURS}
    requires = files = None

    def __init__(self):
        import hvd_magic
        self.version = hvd_magic.__version__

    def read_text(self, name):
        return None


def _ours():
    try:
        return metadata.distribution(OURS)
    except metadata.PackageNotFoundError:
        return _Unlisted()


def _files(dist):
    """(path in the zip, file) of every file of `dist`, not its scripts outside site-packages,
    caches or path hooks; an editable one's packages walked, and hvd_magic's the very package
    this notebook runs (whatever metadata a checkout holds)."""
    if _is_ours(dist):
        import hvd_magic
        files = _walked([os.path.dirname(hvd_magic.__file__)])
        folder = metadata_compat.metadata_folder(dist)
        metadata_file = dist.locate_file(f"{folder.name}/METADATA") if folder is not None else None
        if metadata_file is not None and os.path.isfile(metadata_file):
            files[f"{OURS}-{dist.version}.dist-info/METADATA"] = str(metadata_file)
        return sorted(files.items())
    base = os.path.realpath(dist.locate_file(""))
    out = {}
    for f in dist.files or ():
        path = os.path.realpath(dist.locate_file(f))
        rel = os.path.relpath(path, base)
        if rel.startswith("..") or "__pycache__" in rel or rel.endswith((".pth", ".pyc")) or \
                rel.startswith("__editable__") or not os.path.isfile(path):
            continue
        out[rel] = path
    if _editable(dist):
        out.update(_walked(_top_levels_of_editable(dist)))
    return sorted(out.items())


def _is_ours(dist):
    return normalized(dist.metadata["Name"]) == normalized(OURS)


def _walked(packages):
    """{path in the zip: file} of every file under the package folders `packages`."""
    out = {}
    for top in packages:
        root = os.path.dirname(top)
        for folder, dirs, names in os.walk(top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                if not name.endswith(".pyc"):
                    path = os.path.join(folder, name)
                    out[os.path.relpath(path, root)] = path
    return out


def _top_levels_of_editable(dist):
    name = normalized(dist.metadata["Name"]).replace("-", "_")
    spec = importlib.util.find_spec(name)
    return list(spec.submodule_search_locations or ()) if spec is not None else []


def _digest(dist):
    """The hash of what `dist` holds: its RECORD's (which lists every file's own hash, as
    installed), or, for an editable one, of its files' names and contents."""
    h = hashlib.sha256()
    record = None if _editable(dist) or _is_ours(dist) else dist.read_text("RECORD")
    if record:
        h.update(record.encode())
    else:
        for rel, path in _files(dist):
            h.update(rel.encode() + b"\0")
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()[:16]


def _glibc(dist):
    """The oldest glibc the wheel's tags allow ("2.17"), or ""."""
    found = []
    for line in (dist.read_text("WHEEL") or "").splitlines():
        if not line.startswith("Tag:"):
            continue
        for plat in line.split("-")[-1].strip().split("."):
            m = re.match(r"manylinux_(\d+)_(\d+)_", plat)
            if m:
                found.append((int(m.group(1)), int(m.group(2))))
            elif plat.split("_")[0] in _MANYLINUX:
                found.append(tuple(int(p) for p in _MANYLINUX[plat.split("_")[0]].split(".")))
    return ".".join(map(str, min(found))) if found else ""


def _suffixes(files):
    known = sorted(importlib.machinery.EXTENSION_SUFFIXES, key=len, reverse=True)
    found = set()
    for rel, _ in files:
        if rel.endswith(_BINARY):
            found.add(next((s for s in known if rel.endswith(s)), os.path.splitext(rel)[1]))
    return tuple(sorted(found))


_packed = {}


def _compiled(src, rel):
    """`src` compiled, as a .pyc beside its .py in a zip: Spark's Python worker imports
    hvd_magic from the zip, where it cannot cache what it compiles (~50 ms a worker). Its hash
    is not checked; a Python of another version rejects it by its magic number and compiles."""
    import py_compile
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "c.pyc")
        py_compile.compile(src, cfile=out, dfile=rel, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        with open(out, "rb") as f:
            return f.read()


def pack(dist):
    """(`Parcel`, the zip's path): `dist` packed once, kept by its content's hash (compiled
    files stored as they are: packing numpy takes a fraction of a second, not seconds)."""
    key = (str(metadata_compat.metadata_folder(dist) or ""), _digest(dist))
    if key in _packed and os.path.isfile(_packed[key][1]):
        return _packed[key]
    name, version = dist.metadata["Name"], dist.version
    stem = f"{normalized(name).replace('-', '_')}-{version}-{key[1]}"
    path = os.path.join(cache_folder(), stem + ".zip")
    if os.path.isfile(path):  # packed by an earlier process
        with zipfile.ZipFile(path) as z:
            suffixes = _suffixes((rel, None) for rel in z.namelist())
    else:
        files = _files(dist)
        suffixes = _suffixes(files)
        os.makedirs(cache_folder(), exist_ok=True)
        part = f"{path}.part-{os.getpid()}"
        how = dict(compression=zipfile.ZIP_STORED) if suffixes else \
            dict(compression=zipfile.ZIP_DEFLATED, compresslevel=1)
        ours = _is_ours(dist)
        with zipfile.ZipFile(part, "w", **how) as z:
            for rel, src in files:
                z.write(src, rel)
                if rel.endswith(".py") and ours:
                    z.writestr(rel + "c", _compiled(src, rel))
        os.replace(part, path)
    ours = _is_ours(dist)
    parcel = Parcel(name, version, stem + ".zip", os.path.getsize(path), suffixes=suffixes,
                    glibc=_glibc(dist) if suffixes else "",
                    machine=platform.machine() if suffixes else "",
                    built_for=here(), always=ours,
                    worker=ours or normalized(name) in RANK_NEEDS)
    _packed[key] = parcel, path
    return _packed[key]


def send(sc, imports, only=None):
    """The parcels of a job (`chosen`), each added to SparkContext `sc` once; (the parcels,
    a line saying what was newly sent, or None)."""
    started = time.monotonic()
    packed = [pack(dist) for dist in chosen(imports, only)]
    sent = sc.__dict__.setdefault("_hvd_magic_shipped", set())
    new = [(parcel, path) for parcel, path in packed if parcel.file not in sent]
    for parcel, path in new:
        if parcel.always:  # the Python worker imports it to run the task: on its path
            before = list(sys.path)
            sc.addPyFile(path)
            sys.path[:] = before  # (pyspark puts it on the notebook's path too: not wanted)
        else:
            sc.addFile(path)
        sent.add(parcel.file)
    if not new:
        return [parcel for parcel, _ in packed], None
    mb = sum(parcel.size for parcel, _ in new) / 1e6
    names = ", ".join(parcel.label for parcel, _ in new)
    line = (f"sent to the executors: {names} ({mb:.1f} MB, {time.monotonic() - started:.1f} s; "
            f"{plural(len(new), 'package')}, each used where an executor lacks it or has another "
            f"version, and kept there for later runs)")
    return [parcel for parcel, _ in packed], line


def what_ships(master):
    """A line for `%horovod_env`: what runs on `master` send to its executors."""
    if not master.startswith(("spark://", "yarn", "k8s://", "mesos://", "local-cluster")):
        return ("Runs on a local session send nothing: its executors run this notebook's "
                "Python. On a cluster, hvd_magic and the packages a job imports go with it.")
    packed = [pack(dist)[0] for dist in chosen((), only=())]
    mb = sum(parcel.size for parcel in packed) / 1e6
    return (f"Runs on this cluster send {', '.join(p.label for p in packed)} ({mb:.1f} MB) and "
            f"the packages a job imports, with what they require (torch, TensorFlow, Horovod "
            f"only when --ship names them); an executor uses what it lacks or has at another "
            f"version, and keeps it for later runs.")
