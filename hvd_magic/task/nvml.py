"""A rank's GPUs as NVML knows them, through ``libnvidia-ml.so.1`` by ctypes (no framework is
imported): each one's utilisation and memory, for the resources sampler (`task.resources`).

A rank names its GPUs as CUDA does (its ``CUDA_VISIBLE_DEVICES``): a number is a place in CUDA's
order of the machine's GPUs, fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; a ``GPU-...``
or ``MIG-...`` is a UUID. NVML numbers GPUs by PCI bus: CUDA's GPU 0 need not be NVML's. So every
GPU is found in NVML by its UUID: a number's is read from CUDA's driver (``libcuda.so.1``:
``cuDeviceGetUuid``) in a short child process that sees every GPU (no ``CUDA_VISIBLE_DEVICES``),
so that neither the task nor the notebook (whose threads the driver-only tasks are) starts CUDA.
Where CUDA's driver cannot say, a number is taken as NVML's own (right where CUDA orders by PCI
bus, or on a machine of one kind of GPU, where fastest first keeps the bus order).

``HVD_MAGIC_NVML`` and ``HVD_MAGIC_LIBCUDA`` name other libraries (the tests' fakes: this
project's machines have no GPU).

Not for: sampling a process (`task.resources`), or which GPUs a rank gets (`task.gpus`).
"""

import ctypes
import json
import os
import subprocess
import sys

_UUID_FORMAT = "GPU-{}-{}-{}-{}-{}"


class Nvml:
    """NVML through ctypes: each GPU's utilisation and memory, or nothing where there is none."""

    class _Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    class _Rates(ctypes.Structure):
        _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

    def __init__(self, library=None):
        self.lib = None
        self._handles = {}   # a rank's name of a GPU -> NVML's handle (None: not found)
        self._cuda = None    # CUDA's order of the machine's GPUs, as UUIDs, once read
        try:
            lib = ctypes.CDLL(library or os.environ.get("HVD_MAGIC_NVML", "libnvidia-ml.so.1"))
            if lib.nvmlInit_v2() == 0:
                self.lib = lib
        except (OSError, AttributeError):
            pass

    def count(self):
        """How many GPUs the driver sees (0 without NVML)."""
        count = ctypes.c_uint()
        if self.lib is None or self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            return 0
        return count.value

    def handle(self, name):
        """NVML's handle of the GPU a rank names `name` (a CUDA number, a UUID), or None."""
        name = str(name).strip()
        if name not in self._handles:
            self._handles[name] = self._find(name)
        return self._handles[name]

    def _find(self, name):
        if self.lib is None:
            return None
        handle = ctypes.c_void_p()
        if name.isdigit():
            if self._cuda is None:
                self._cuda = cuda_order()
            if int(name) >= len(self._cuda):  # (CUDA's driver could not say: NVML's number)
                found = self.lib.nvmlDeviceGetHandleByIndex_v2(int(name), ctypes.byref(handle))
                return handle if found == 0 else None
            name = self._cuda[int(name)]
        by_uuid = getattr(self.lib, "nvmlDeviceGetHandleByUUID", None)
        # (CUDA's driver says a MIG device's UUID without its prefix: "GPU-" is written above)
        for uuid in (name, "MIG-" + name[4:]) if name.startswith("GPU-") else (name,):
            if by_uuid is not None and by_uuid(uuid.encode(), ctypes.byref(handle)) == 0:
                return handle
        return None

    def read(self, name):
        """`name`'s utilisation and memory: ``{"index", "util", "mem", "mem_total"}`` (its
        ``index`` the rank's name of it: a number as a number), or None."""
        handle, lib = self.handle(name), self.lib
        memory, rates = self._Memory(), self._Rates()
        if handle is None or lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != 0:
            return None
        util = rates.gpu if lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) == 0 \
            else None  # (a MIG device has none)
        name = str(name).strip()
        return {"index": int(name) if name.isdigit() else name, "util": util, "mem": memory.used,
                "mem_total": memory.total}


def cuda_order(timeout=30):
    """The UUIDs of every GPU of this machine in CUDA's order ([] where CUDA's driver cannot
    say), read by a child process that sees them all."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join([package] + [p for p in [env.get("PYTHONPATH")] if p])
    try:
        # (not ``-m hvd_magic.task.nvml``: the package imports this module before running it)
        out = subprocess.run([sys.executable, "-c", "import json, hvd_magic.task.nvml as nvml\n"
                              "print(json.dumps(nvml.cuda_uuids()))"], env=env,
                             capture_output=True, text=True, timeout=timeout).stdout
        return list(json.loads(out or "[]"))
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return []


def cuda_uuids():
    """This process's CUDA GPUs' UUIDs in CUDA's order, through its driver (no context made)."""
    try:
        cuda = ctypes.CDLL(os.environ.get("HVD_MAGIC_LIBCUDA", "libcuda.so.1"))
        if cuda.cuInit(0) != 0:
            return []
    except (OSError, AttributeError):
        return []
    get_uuid = getattr(cuda, "cuDeviceGetUuid_v2", None) or getattr(cuda, "cuDeviceGetUuid", None)
    count, uuids = ctypes.c_int(), []
    if get_uuid is None or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    for ordinal in range(count.value):
        device, raw = ctypes.c_int(), (ctypes.c_ubyte * 16)()
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0 or get_uuid(raw, device) != 0:
            return []
        h = bytes(raw).hex()
        uuids.append(_UUID_FORMAT.format(h[:8], h[8:12], h[12:16], h[16:20], h[20:]))
    return uuids
