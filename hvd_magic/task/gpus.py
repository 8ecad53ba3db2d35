"""Which GPUs a rank sees, and which of them are its own: one rule for every launcher.

All of a run's ranks on one host see the same ordered list of the GPUs the run has there
(``CUDA_VISIBLE_DEVICES``), and a rank's own GPU is at its local rank's place in that list, so
the line every seed pins with (``torch.cuda.set_device(hvd.local_rank())``,
``visible_device_list = str(hvd.local_rank())``, ``LOCAL_RANK`` under torchrun) lands each rank
on its own GPU, as under torchrun, horovodrun and Ray Train. NCCL needs to see its peers'
devices too (CUDA IPC between the ranks of one host).

The list is gathered across the launch (each task's own GPUs travel with its rendezvous
values: `frameworks.Serving`): a host's ranks in local-rank order, each one's first GPU, then
each one's second... so a rank given several GPUs finds its first at its local rank and the
others at ``local_rank + k * local_size``. Ranks that share a GPU (more ranks than GPUs) see
one entry for it: their own GPU is still named in ``HVD_MAGIC_GPUS`` (and torch's current
device: `hvd_magic.rank.gpus`), but local ranks past the GPUs' count cannot pin by local rank.

``HVD_MAGIC_GPU_VIEW=own`` (``--env``) gives each rank its own GPUs alone, as ``cuda:0``...,
and ``LOCAL_RANK=0`` (torchrun's ``--virtual-local-rank``), for code hard-wired to ``cuda:0``.

Not for: Spark's or the driver's sources of GPUs (`task.settings.Coordinator.gpus`,
`launch.local.visible_gpus`), or the rank's own pinning (`hvd_magic.rank.gpus`).
"""

from dataclasses import dataclass

from ..rank.gpus import OWN, SHARED_WITH  # (the rank's side reads them)

VIEW = "HVD_MAGIC_GPU_VIEW"         # "own": each rank sees its own GPUs alone


@dataclass(frozen=True)
class GpuLayout:
    visible: tuple          # CUDA_VISIBLE_DEVICES of every rank on the host (ids, in order)
    own: tuple              # this rank's GPUs (ids)
    shared_with: tuple      # (rank, gpu id) of the host's other ranks on this rank's GPUs

    @property
    def indices(self):
        """The rank's own GPUs as indices into `visible` (torch's ``cuda:i``)."""
        return tuple(self.visible.index(g) for g in self.own)

    def env(self, view="shared"):
        """The rank's variables: the list it sees, its own GPUs in it, who shares them."""
        if not self.own:
            return {}
        visible = self.own if view == "own" else self.visible
        env = {"CUDA_VISIBLE_DEVICES": ",".join(visible),
               OWN: ",".join(str(visible.index(g)) for g in self.own)}
        if self.shared_with:
            env[SHARED_WITH] = ",".join(f"{r}:{g}" for r, g in self.shared_with)
        if view == "own":
            env["LOCAL_RANK"] = "0"  # (Horovod's local rank stays: its rings need it)
        return env


def layout(own_by_rank, host_ranks, rank):
    """The `GpuLayout` of `rank`, given every rank's own GPUs (`own_by_rank`: rank -> ids) and the
    ranks on its host in local-rank order (`host_ranks`)."""
    visible = []
    for k in range(max((len(own_by_rank.get(r) or ()) for r in host_ranks), default=0)):
        for r in host_ranks:
            ids = own_by_rank.get(r) or ()
            if k < len(ids) and ids[k] not in visible:
                visible.append(ids[k])
    own = tuple(own_by_rank.get(rank) or ())
    shared = tuple((r, g) for r in host_ranks if r != rank
                   for g in own_by_rank.get(r) or () if g in own)
    return GpuLayout(tuple(visible), own, shared)

