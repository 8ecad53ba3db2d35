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

Spark's GPU addresses (`spark_ids`) are read one way for all of an executor's tasks: as the ids
``CUDA_VISIBLE_DEVICES`` uses, or as places in the executor's own ``CUDA_VISIBLE_DEVICES``. A
task alone cannot tell: with the executor's list ``2,0``, address ``0`` is both; read per task,
one task's ``0`` (an id) and another's ``1`` (an index: ``0``) put two tasks on GPU 0.

Not for: Spark's or the driver's sources of GPUs (`task.settings.Coordinator.gpus`,
`launch.local.visible_gpus`), or the rank's own pinning (`hvd_magic.rank.gpus`).
"""

import os
import threading
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


def spark_ids(addresses, visible):
    """Spark's GPU `addresses` for one executor (every one its tasks were given), as ids of
    ``CUDA_VISIBLE_DEVICES``: ``{address: id}``. `visible` is the executor's own
    ``CUDA_VISIBLE_DEVICES`` (None where it has none).

    - the executor sees every GPU (no list of its own): the addresses are ids, as Spark's
      discovery script printed them (nvidia-smi's, a UUID ``GPU-...``, a MIG ``MIG-...``);
    - every address is in the executor's list: ids (a discovery script that read the list);
    - else, every address a place in the list (``0``, ``1``... below its length): places, mapped
      through it (a script that counted the GPUs the executor sees);
    - else the addresses are ids the list does not hold, kept as Spark gave them.
    """
    addresses = [str(a).strip() for a in addresses]
    seen = [v.strip() for v in (visible or "").split(",") if v.strip()]
    places = seen and not set(addresses) <= set(seen) and \
        all(a.isdigit() and int(a) < len(seen) for a in addresses)
    return _read(addresses, seen if places else None)


def _read(addresses, places_in=None):
    if places_in is None:
        return {a: a for a in addresses}
    return {a: places_in[int(a)] if a.isdigit() and int(a) < len(places_in) else a
            for a in addresses}


def spark_ids_once(addresses, visible, folder):
    """`spark_ids` for an executor whose tasks come one at a time (an elastic run's slots, a
    one-task job each): the first one's reading (ids or places) is kept in `folder` (the
    executor's own: SparkFiles' root), and its later tasks read their addresses the same way,
    whatever each alone would suggest."""
    addresses = [str(a).strip() for a in addresses]
    if not addresses:  # (no GPU: nothing to read, nor to decide for the later tasks)
        return {}
    seen = [v.strip() for v in (visible or "").split(",") if v.strip()]
    ids = spark_ids(addresses, visible)
    reading = "places" if any(ids[a] != a for a in ids) else "ids"
    path = os.path.join(folder, "hvd_magic-gpu-addresses")
    mine = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with open(mine, "w") as f:
        f.write(reading)
    try:
        os.link(mine, path)  # (the first task's reading stands: a link is made once)
    except FileExistsError:
        with open(path) as f:
            reading = f.read()
    except OSError:  # (a filesystem without hard links: this task's own reading, unkept)
        pass
    finally:
        os.remove(mine)
    return _read(addresses, seen if reading == "places" else None)


def task_gpus(said, executor_of):
    """Every task's own GPU ids (rank -> ids), from what each task said (rank -> ``{"spark":
    its addresses, "visible": its executor's CUDA_VISIBLE_DEVICES}``) and its executor
    (`executor_of`: rank -> executor): one reading of Spark's addresses per executor."""
    ranks_of = {}
    for rank in said:
        ranks_of.setdefault(executor_of[rank], []).append(rank)
    own = {}
    for ranks in ranks_of.values():
        spark = {r: [str(a).strip() for a in (said[r] or {}).get("spark") or ()] for r in ranks}
        ids = spark_ids([a for r in ranks for a in spark[r]],
                        (said[ranks[0]] or {}).get("visible"))
        own.update({r: [ids[a] for a in spark[r]] for r in ranks})
    return own


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

