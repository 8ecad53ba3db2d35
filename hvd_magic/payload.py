"""Large values of a job: each rank reads them from one file its machine holds, not from a copy.

The driver shares a large value (its pickled bytes) with `Launcher.share`. Where every task runs
on the driver's machine (driver-only ranks, a ``local[N]`` Spark), that is a `LocalFile`: the
bytes written once to shared memory (``/dev/shm`` when it has room, else the temp folder),
removed when the run ends. On a cluster it is a Spark broadcast, which Spark writes to one file
per executor. Either way a task puts in its rank's job a reference to the file, not the value:
the rank opens it and unpickles the value itself. Before, every task unpickled the broadcast, pickled the whole job again with
the value in it into its own ``job.pkl``, and the rank read that back: four copies of the value
per rank, and a write of it per rank (+1.5 s for 200 MB at np 2, bench/bench_payload.py).

A Spark broadcast is not used on one machine because its file is written to ``spark.local.dir``
on disk (1.1 s for 200 MB on this 2-core VM under load; /dev/shm: ~0.1 s). Where Spark keeps no
file (broadcast encryption on: the JVM streams the value to the worker) or a launcher shares the
bytes themselves (warm sessions), the bytes go in the job as before.

A value whose bulk is in buffers (numpy arrays, pandas columns, Arrow tables) is pickled with
protocol 5 and its buffers kept out of band (`dumps` gives an `OutOfBand`): views of the value's
own memory, so the driver makes no copy of a 200 MB array before writing it to the shared file,
and a rank maps that file (copy-on-write) instead of reading it: the ranks of a machine share its
pages until one writes to them.

Shared by both sides: the driver calls `dumps` and `LocalFile`, the task `for_rank`, the rank
`load`. Not for: small values, which travel inside the job.
"""

import mmap
import os
import pickle
import shutil
import struct
import tempfile
import weakref

from .cleanup import Cleanup

FILE_KEY = "hvd_magic.shared_file"  # {FILE_KEY: path}: the value is in that file
RAW_KEY = "raw"                     # the file holds the value's pickle (not a pickle of those bytes)
MAPPED_KEY = "mapped"               # the file holds an OutOfBand value: its buffers, then its index
OUT_OF_BAND_FROM = 1 << 20          # buffers smaller than this in all travel inside the pickle
_ALIGN = 64                         # each buffer starts at a multiple of this in the file
_SIZE = struct.Struct("<Q")


def cloud_dumps(value, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=None):
    """`cloudpickle.dumps`, its code objects keeping their file names: cloudpickle >= 3.1.3 writes
    ``<dynamic-code>`` instead, and a rank's traceback would lose the cell's lines (found by
    ``<hvd_magic cell N>``, the file name a cell is compiled with)."""
    import io

    from .compat.cloudpickle import code_naming_pickler

    buffer = io.BytesIO()
    code_naming_pickler()(buffer, protocol=protocol, buffer_callback=buffer_callback).dump(value)
    return buffer.getvalue()


class OutOfBand:
    """A value pickled with protocol 5, its large buffers left out: `head` (the pickle without
    them) and `buffers` (memoryviews of the value's memory). `len()` is the whole size;
    `inband()` the ordinary pickle, where bytes must travel (a cluster's broadcast, Spark
    Connect, a warm session, a small value)."""

    def __init__(self, obj, head, buffers):
        self.obj, self.head = obj, head
        self.buffers = [b.raw() for b in buffers]

    def __len__(self):
        return len(self.head) + sum(b.nbytes for b in self.buffers)

    def inband(self):
        return cloud_dumps(self.obj)


def dumps(value):
    """`value` pickled by cloudpickle: bytes, or an `OutOfBand` when its buffers are large."""
    buffers = []
    head = cloud_dumps(value, protocol=5, buffer_callback=buffers.append)
    if not buffers:
        return head
    try:
        oob = OutOfBand(value, head, buffers)
    except BufferError:  # a buffer that is not contiguous: the ordinary pickle copies it
        return cloud_dumps(value)
    return oob if len(oob) - len(head) >= OUT_OF_BAND_FROM else oob.inband()


def inband(data):
    """Pickled bytes, whichever form `dumps` gave."""
    return data.inband() if isinstance(data, OutOfBand) else data


def _write_out_of_band(f, oob):
    """The buffers at aligned offsets, then (head, their spans) pickled, then that pickle's size."""
    spans = []
    for buffer in oob.buffers:
        offset = -f.tell() % _ALIGN
        f.write(b"\0" * offset)
        spans.append((f.tell(), buffer.nbytes))
        f.write(buffer)
    index = pickle.dumps((oob.head, spans), protocol=pickle.HIGHEST_PROTOCOL)
    f.write(index)
    f.write(_SIZE.pack(len(index)))


def _load_mapped(path):
    """An OutOfBand value from its file: the buffers are the file's pages, mapped copy-on-write
    (writable by this rank, shared with the other ranks until written)."""
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(mapped)
    (size,) = _SIZE.unpack(view[-_SIZE.size:])
    head, spans = pickle.loads(view[-_SIZE.size - size:-_SIZE.size])
    return pickle.loads(head, buffers=[view[offset:offset + n] for offset, n in spans])


def _roomy_folder(size):
    """/dev/shm when it can hold `size` bytes with room to spare, else the temp folder."""
    try:
        if shutil.disk_usage("/dev/shm").free > 2 * size + (256 << 20):
            return "/dev/shm"
    except OSError:
        pass
    return tempfile.gettempdir()


class LocalFile:
    """A large value's pickled bytes in one file of this machine, for tasks that run here.

    Pickles as its path only. `release()` (at the run's end; else when garbage collected or at
    exit) removes the file; this process's `Cleanup` if it is killed."""

    def __init__(self, data):
        fd, self.path = tempfile.mkstemp(prefix="hvd_magic-value-", dir=_roomy_folder(len(data)))
        self.mapped = isinstance(data, OutOfBand)
        with os.fdopen(fd, "wb") as f:
            if self.mapped:
                _write_out_of_band(f, data)
            else:
                f.write(data)
        Cleanup.here().keep(self.path)  # (gone even if this process is SIGKILLed)
        self._remove = weakref.finalize(self, _unlink, self.path)

    def release(self):
        self._remove()

    def __getstate__(self):
        return {"path": self.path, "mapped": self.mapped}

    def __setstate__(self, state):  # the task's copy: the path, never the right to remove it
        self.path, self.mapped = state["path"], state.get("mapped", False)
        self._remove = lambda: None


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass
    Cleanup.here().forget(path)


def release(ref):
    """The run is over: remove what `ref` holds (a LocalFile's file; nothing for the others)."""
    if isinstance(ref, LocalFile):
        ref.release()


def _spark_file(ref):
    """The file a PySpark broadcast was left in on this executor, if it looks like one."""
    from .compat.pyspark import broadcast_file

    path = broadcast_file(ref)
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(1)
    except OSError:
        return None
    return path if head == pickle.PROTO else None


def for_rank(ref):
    """What the rank's job holds for a shared value `ref` (a LocalFile, a broadcast, the bytes)."""
    if isinstance(ref, LocalFile):
        return {FILE_KEY: ref.path, MAPPED_KEY if ref.mapped else RAW_KEY: True}
    path = _spark_file(ref)
    if path is not None:
        return {FILE_KEY: path}
    return ref.value if hasattr(ref, "value") else ref


def load(data):
    """The value itself, from what `for_rank` gave: pickled bytes, or a file holding them (a
    LocalFile), an OutOfBand value's file (mapped), or a file holding a pickle of them (what a
    Spark broadcast of them writes)."""
    if isinstance(data, dict) and FILE_KEY in data:
        if data.get(MAPPED_KEY):
            return _load_mapped(data[FILE_KEY])
        with open(data[FILE_KEY], "rb") as f:
            if data.get(RAW_KEY):
                return pickle.load(f)  # one copy: straight from the file into the value
            data = pickle.load(f)
    return pickle.loads(data)

