"""What the notebook shipped to this executor (`hvd_magic.launch.shipping`), put to use.

Each `Parcel` is one distribution's files in a zip that Spark fetched to the executor. Where the
executor lacks that distribution, or has another version of it (hvd_magic itself: always), the
zip is unpacked once into this host's cache, a folder named by its content hash that later runs
find (`arrive`), and that folder goes first on the rank's path. The cache is this user's private
folder in the temp folder, never one another user made or could write to, and pruned
(`hvd_magic.task.caches`). A compiled distribution that
cannot run on this executor's Python (another Python version, machine or an older C library) is
refused before the rank starts, naming the notebook's version and this executor's.

Standard library only, and imported by the task before anything else of ours: the Python worker
needs no package but Python to get here (psutil and cloudpickle may come this way too).

Not for: choosing or packing what ships (`hvd_magic.launch.shipping`, the driver's side).
"""

import atexit
import dataclasses
import importlib.machinery
import importlib.metadata
import os
import platform
import shutil
import sys
import tempfile
import zipfile

from .caches import Cache, not_private


@dataclasses.dataclass(frozen=True)
class Parcel:
    name: str               # the distribution, as its metadata names it
    version: str
    file: str               # the zip's name among Spark's files: NAME-VERSION-DIGEST.zip
    size: int               # its bytes
    suffixes: tuple = ()    # the extension-module suffixes its compiled files use (): pure Python)
    glibc: str = ""         # the oldest C library its wheel's tags allow ("2.17"), where said
    machine: str = ""       # the machine its compiled files are for ("x86_64")
    built_for: str = ""     # the notebook's Python, machine and C library, for the message
    always: bool = False    # used whatever the executor has (hvd_magic: the worker runs it)
    worker: bool = False    # the task's own Python worker needs it too (psutil, cloudpickle)

    @property
    def label(self):
        return f"{self.name} {self.version}"


def here():
    """This Python, in the words a refusal uses: "Python 3.10.12 (x86_64, glibc 2.31)"."""
    libc, version = platform.libc_ver()
    c = f", {libc} {version}" if libc and version else ""
    return f"Python {platform.python_version()} ({platform.machine()}{c})"


def _version_tuple(text):
    return tuple(int(p) for p in text.split(".") if p.isdigit())


def unfit(parcel):
    """Why `parcel`'s compiled files cannot run on this Python; None when they can."""
    if parcel.machine and parcel.machine != platform.machine():
        return f"its compiled modules are for {parcel.machine}"
    missing = [s for s in parcel.suffixes if s not in importlib.machinery.EXTENSION_SUFFIXES]
    if missing:
        return f"its compiled modules end in {missing[0]}, which this Python does not load"
    libc, version = platform.libc_ver()
    if parcel.glibc and libc == "glibc" and _version_tuple(version) < _version_tuple(parcel.glibc):
        return f"it needs glibc {parcel.glibc} or newer"
    return None


def installed_version(name):
    """The version of distribution `name` this executor has of its own (None: none), not
    counting what was shipped (a worker that ran an earlier job has that on its path)."""
    ours = (cache_root(), *(kept.root for kept in _caches.values()))
    path = [p for p in sys.path if not p.startswith(ours)]
    try:
        for dist in importlib.metadata.distributions(name=name, path=path):
            return dist.version
    except Exception:  # noqa: BLE001  (a broken installation is not one we can use)
        return None
    return None


def cache_root():
    """This user's folder of unpacked parcels on this host (kept across runs and sessions)."""
    return os.path.join(tempfile.gettempdir(), f"hvd_magic-shipped-{os.getuid()}")


_caches = {}


def cache():
    """The `Cache` of unpacked parcels: `cache_root()` where it is this user's and private; else
    (another user made it, or opened it up: anyone could have put code there that the rank would
    import first) a private folder of this worker's own, removed as it exits, and a line in the
    executor's log that says so. The run goes on, unpacking once per worker instead of once per
    host: refusing it would let any user of the host stop this one's runs."""
    root = cache_root()
    if root not in _caches:
        try:
            why = not_private(root)
        except OSError as exc:  # (a temp folder this user cannot write to: mkdtemp says so)
            why = f"{root} cannot be used ({exc})"
        if why is None:
            _caches[root] = Cache(root)
        else:
            own = tempfile.mkdtemp(prefix=f"hvd_magic-shipped-{os.getuid()}-private-")
            atexit.register(shutil.rmtree, own, ignore_errors=True)
            sys.stderr.write(f"hvd_magic: {why}; nothing in it is used. The packages the "
                             f"notebook shipped are unpacked into {own} for this worker alone. "
                             f"Remove {root} (its owner or root can), or give the executors "
                             f"another TMPDIR.\n")
            _caches[root] = Cache(own)
    return _caches[root]


def unpacked(parcel, archive):
    """The folder holding `parcel`'s files, unpacked from `archive` once per host (a later run
    of any session finds it by its name, its content's hash) and held while this worker lives.
    Where it was unpacked now, the cache is pruned (`Cache.prune`)."""
    def unpack(part):
        with zipfile.ZipFile(archive) as z:
            z.extractall(part)
    kept = cache()
    folder, made = kept.use(parcel.file[:-len(".zip")], unpack)
    if made:
        kept.prune()
    return folder


_arrived = {}


def arrive(parcels, fetched):
    """(the folders that go first on the rank's path, in order; what cannot be used here, as
    lines), for `parcels`, whose zips `fetched(file)` finds (Spark's `SparkFiles.get`). The
    folders the task's own Python worker needs go on its `sys.path` too. Once per worker."""
    key = tuple(parcels)
    if key not in _arrived:
        folders, refused = [], []
        for parcel in parcels:
            theirs = installed_version(parcel.name)
            if theirs == parcel.version and not parcel.always:
                continue  # the executor's own is the notebook's version
            why = unfit(parcel) if parcel.suffixes else None
            if why is not None:
                has = f"has {parcel.name} {theirs}" if theirs else f"has no {parcel.name}"
                refused.append(
                    f"{parcel.label} from the notebook ({parcel.built_for}) cannot run on this "
                    f"executor's {here()}: {why}; the executor {has}. Install {parcel.name} "
                    f"{parcel.version} on the executors, or run them on the notebook's Python.")
                continue
            try:
                folder = unpacked(parcel, fetched(parcel.file))
            except Exception as exc:  # noqa: BLE001  (a full disk, a file Spark did not bring)
                refused.append(f"{parcel.label} from the notebook could not be unpacked on "
                               f"this executor ({type(exc).__name__}: {exc}).")
                continue
            folders.append(folder)
            if parcel.worker and folder not in sys.path:
                sys.path.insert(0, folder)
        _arrived[key] = (folders, refused)
    return _arrived[key]


def spark_fetched(file):
    from pyspark import SparkFiles
    return SparkFiles.get(file)
