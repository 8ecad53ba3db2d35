"""torch.distributed's and torch.cuda's private APIs that the ranks use, each feature-detected
(pyproject allows torch >= 2.1; the sandbox runs 2.13): a public API first where torch has one,
the private one quietly where only it works (torch 2.14 warns on `_set_pg_timeout` itself), and
a one-line `unavailable` where neither is there.

Called only where torch is already imported (the rank side, after the user's code imported it).
"""

import io
import warnings
from datetime import timedelta

from . import private, unavailable


def _c10d():
    import torch.distributed.distributed_c10d as c10d
    return c10d


def set_group_timeout(timeout):
    """Make the default group's collectives wait `timeout` from now on (it was made with a short
    one, for its connections). A process group's own ``set_timeout`` where torch has it, else
    ``distributed_c10d._set_pg_timeout`` (its FutureWarning kept to ourselves). Returns False
    where torch has neither: the caller makes its group with `timeout` from the start."""
    import torch.distributed as dist

    group = dist.group.WORLD
    if hasattr(group, "set_timeout"):
        group.set_timeout(timeout)
        return True
    set_pg_timeout = getattr(_c10d(), "_set_pg_timeout", None)
    if set_pg_timeout is None:
        return False
    with warnings.catch_warnings():  # ours to call, not the user's to be told about
        warnings.filterwarnings("ignore", message=r".*_set_pg_timeout", category=FutureWarning)
        set_pg_timeout(timeout)
    return True


def can_set_group_timeout():
    """Whether `set_group_timeout` will work in this torch (said once where not)."""
    import torch.distributed as dist

    if hasattr(dist.ProcessGroup, "set_timeout") or hasattr(_c10d(), "_set_pg_timeout"):
        return True
    unavailable("torch", "a process group's timeout set after its making",
                "an elastic world's group is made with the whole timeout, so a member lost "
                "while it connects holds the others that long")
    return False


def default_timeout(backend):
    """torch's default timeout for a group of `backend`: ``_get_default_timeout`` where torch has
    it, else the documented defaults (NCCL 10 minutes, others 30)."""
    found = private(_c10d(), "_get_default_timeout", "torch",
                    "distributed_c10d._get_default_timeout",
                    "an elastic group without its own timeout waits torch's documented default")
    if found is not None:
        return found(backend)
    return timedelta(minutes=10 if str(backend).lower() == "nccl" else 30)


def restart_group_names():
    """Set torch's count of unnamed groups back to 0 (torch does so when the default group is
    destroyed; a group whose making failed counted too). Returns whether it could: where torch
    keeps no such count in ``distributed_c10d._world``, a world made again after a failed try
    may name its group otherwise than its peers' (they then wait out the store's timeout)."""
    world = getattr(_c10d(), "_world", None)
    if world is None or not hasattr(world, "group_count"):
        unavailable("torch", "distributed_c10d._world.group_count",
                    "an elastic world formed again after a failed try may wait for its peers "
                    "until the store's timeout")
        return False
    world.group_count = 0
    return True


def default_store():
    """The default group's store (``distributed_c10d._get_default_store``), or None where torch
    has no such call: ranks then leave without waiting for each other at the end, and a slow
    peer may see "Connection reset by peer" as it finishes making its group."""
    found = private(_c10d(), "_get_default_store", "torch", "distributed_c10d._get_default_store",
                    "ranks leave without waiting for their peers' group at the end")
    return found() if found is not None else None


def abort_default_group():
    """Abort the default group (its NCCL communicators) now; False where its process group has
    no ``abort``: a collective waiting on a lost rank then waits for NCCL's own timeout."""
    import torch.distributed as dist

    group = dist.group.WORLD
    if not hasattr(group, "abort"):
        unavailable("torch", "ProcessGroup.abort",
                    "an NCCL collective waiting on a lost rank waits for NCCL's timeout")
        return False
    group.abort()
    return True


def when_cuda_starts(call):
    """Have torch run `call()` when it initialises CUDA (``torch.cuda._lazy_call``), not now:
    CUDA started in a rank before the user's code would break a fork. False where torch has no
    such queue: the rank's GPU is then not made its current device (``cuda`` is ``cuda:0``)."""
    import torch

    lazy = private(torch.cuda, "_lazy_call", "torch", "torch.cuda._lazy_call",
                   "the rank's own GPU is not made its current device (cuda is cuda:0)")
    if lazy is None:
        return False
    lazy(call)
    return True


def flight_recorder_entries():
    """torch's Flight Recorder (torch 2.5 and later: every collective a group issues, Gloo's and
    NCCL's), as its list of entries, or None where torch has none (said once: the stall views
    show Python stacks only)."""
    import torch

    dump = private(getattr(torch._C, "_distributed_c10d", None), "_dump_fr_trace_json", "torch",
                   "Flight Recorder", "stall views show Python stacks only")
    if dump is None:
        return None
    import json

    return json.loads(dump(True, False)).get("entries", [])


def storage_loader_on_cpu(module, name, moved):
    """torch's loader of a pickled storage (``torch.storage._load_from_bytes``: a tensor's pickle
    calls it with the bytes of ``torch.save(storage)``), made to load a storage saved on a CUDA
    device onto the CPU where this Python has no GPU (calling `moved()`), and any other as torch
    does; None for any other name. The one place that knows a private name of torch's: where a
    torch names it otherwise, a CUDA tensor in a value fails to load as in plain torch, and the
    error says to return ``tensor.cpu()`` (`hvd_magic.driver.results`)."""
    if (module, name) != ("torch.storage", "_load_from_bytes"):
        return None
    import torch

    def on_cpu_without_gpu(storage, location):
        if str(location).startswith("cuda") and not torch.cuda.is_available():
            moved()
            return storage  # (torch reads every storage onto the CPU before placing it)
        return None  # where torch would put it

    def load(data):
        return torch.load(io.BytesIO(data), map_location=on_cpu_without_gpu, weights_only=False)

    return load
