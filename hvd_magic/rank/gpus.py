"""A rank on its own GPU even where the cell never pins one, and NCCL refused on a shared GPU.

Every rank of a host sees the host's GPUs (`hvd_magic.task.gpus`); ``HVD_MAGIC_GPUS`` names the
rank's own among them. So that code which never pins lands right too:

- torch: the rank's first GPU becomes torch's current device when CUDA starts in the rank
  (queued with torch's own lazy calls: nothing starts CUDA early, and a rank forked from its
  host's template queues it after the fork, never in the template), so ``device="cuda"`` and
  ``.cuda()`` use it. A cell's own ``set_device`` later wins, as it should.
- TensorFlow maps every GPU it sees: once it is imported, its visible GPUs are the rank's own
  (``tf.config.set_visible_devices``, before its runtime starts). The seeds' pinning lines pick
  the same GPU again (``gpus[hvd.local_rank()]``, ``visible_device_list = str(local_rank)``).
- ``torch.distributed.init_process_group`` (Lightning's and accelerate's too) with NCCL, asked
  for or chosen by torch for a GPU (no backend given), on a GPU another rank of the run shares:
  refused at once, naming the ranks and the GPU, where NCCL would fail minutes later with
  "Duplicate GPU detected" (`refuse_shared_nccl`, called by `torch_store`'s wrapper).

Not for: which GPUs a rank gets (`hvd_magic.task.gpus`).
"""

import functools
import os

from . import hooks
from ..compat import torch as torch_compat

OWN = "HVD_MAGIC_GPUS"              # the rank's own GPUs, as indices in CUDA_VISIBLE_DEVICES
SHARED_WITH = "HVD_MAGIC_GPU_SHARED_WITH"  # "rank:gpu" of the other ranks on the rank's GPUs


class SharedGpuError(RuntimeError):
    """NCCL asked for on a GPU that other ranks of the run share."""


def own():
    """The rank's own GPUs, as indices into what it sees (torch's ``cuda:i``)."""
    return [int(i) for i in os.environ.get(OWN, "").split(",") if i.strip().isdigit()]


def install():
    if own():
        hooks.when_imported("torch", _pin_torch)
        hooks.when_imported("tensorflow", _pin_tensorflow)


def _pin_torch(torch):
    torch_compat.when_cuda_starts(functools.partial(_set_device, torch.cuda, own()[0]))


def _set_device(cuda, index):
    if index < cuda.device_count():
        cuda.set_device(index)


def _pin_tensorflow(tf):
    try:
        gpus = tf.config.list_physical_devices("GPU")
        mine = [gpus[i] for i in own() if i < len(gpus)]
        if mine and len(mine) < len(gpus):
            tf.config.set_visible_devices(mine, "GPU")
    except (AttributeError, RuntimeError, ValueError):  # its runtime already started: as it is
        pass


def _chooses_nccl(args, kwargs):
    """Whether ``init_process_group(*args, **kwargs)`` makes an NCCL group: asked for by name
    (``"nccl"``, ``"cuda:nccl"``), or, with no backend and no device, torch's choice where the
    rank has a CUDA device (then NCCL alone)."""
    backend = kwargs.get("backend", args[0] if args else None)
    if backend is not None:
        return "nccl" in str(backend).lower()
    device = kwargs.get("device_id")
    if device is not None:
        return getattr(device, "type", str(device)).startswith("cuda")
    import torch
    return torch.cuda.is_available()


def refuse_shared_nccl(args, kwargs):
    """Raise `SharedGpuError` where this call would put NCCL on a GPU that another rank shares."""
    shared = [pair.split(":", 1) for pair in os.environ.get(SHARED_WITH, "").split(",") if pair]
    if not shared or not _chooses_nccl(args, kwargs):
        return
    rank = os.environ.get("RANK", "?")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    others = sorted({int(r) for r, _ in shared})
    gpus = ",".join(sorted({g for _, g in shared}))
    count = len(visible.split(","))
    raise SharedGpuError(
        f"NCCL cannot put two ranks on one GPU, and rank {rank} shares GPU {gpus} with "
        f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} (this host's GPUs: "
        f"{visible}). Run as many ranks as GPUs (--np -{count} on the driver; on Spark, "
        f"spark.task.resource.gpu.amount=1), or share the GPUs over Gloo: "
        f"init_process_group(\"gloo\"), or in Lightning "
        f"Trainer(strategy=DDPStrategy(process_group_backend=\"gloo\")).")
