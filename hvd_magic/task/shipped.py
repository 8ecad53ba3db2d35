"""What the notebook shipped to this executor (`hvd_magic.launch.shipping`), put to use.

Each `Parcel` is one distribution's files in a zip that Spark fetched to the executor. Where the
executor lacks that distribution, or has another version of it (hvd_magic itself: always), the
zip is unpacked once into this host's cache, a folder named by its content hash that later runs
find (`arrive`), and that folder goes first on the rank's path. A compiled distribution that
cannot run on this executor's Python (another Python version, machine or an older C library) is
refused before the rank starts, naming the notebook's version and this executor's.

Standard library only, and imported by the task before anything else of ours: the Python worker
needs no package but Python to get here (psutil and cloudpickle may come this way too).

Not for: choosing or packing what ships (`hvd_magic.launch.shipping`, the driver's side).
"""

import dataclasses
import fcntl
import importlib.machinery
import importlib.metadata
import os
import platform
import shutil
import sys
import tempfile
import uuid
import zipfile


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
    path = [p for p in sys.path if not p.startswith(cache_root())]
    try:
        for dist in importlib.metadata.distributions(name=name, path=path):
            return dist.version
    except Exception:  # noqa: BLE001  (a broken installation is not one we can use)
        return None
    return None


def cache_root():
    """This user's folder of unpacked parcels on this host (kept across runs and sessions)."""
    return os.path.join(tempfile.gettempdir(), f"hvd_magic-shipped-{os.getuid()}")


def unpacked(parcel, archive):
    """The folder holding `parcel`'s files, unpacked from `archive` once per host: a later run
    (of any session) finds it by its name, which is its content's hash."""
    root = cache_root()
    folder = os.path.join(root, parcel.file[:-len(".zip")])
    if os.path.isdir(folder):
        return folder
    os.makedirs(root, mode=0o700, exist_ok=True)
    with open(folder + ".lock", "w") as lock:  # one unpacker among this host's executors
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isdir(folder):
            return folder
        part = f"{folder}.part-{uuid.uuid4().hex[:8]}"
        try:
            with zipfile.ZipFile(archive) as z:
                z.extractall(part)
            os.rename(part, folder)  # whole or not at all
        finally:
            shutil.rmtree(part, ignore_errors=True)
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
