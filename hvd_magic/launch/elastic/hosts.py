"""An elastic ring's local and cross ranks by the machines its workers run on.

Horovod's elastic driver sees one host key per slot (`hvd_magic.launch.elastic.launcher`: a failed worker
costs its own key, never its machine's other slots), so by itself it would tell every rank
``local_rank`` 0, ``local_size`` 1 and a cross rank per slot: ``hvd.local_rank()`` would pin every
rank to GPU 0. Here each ring Horovod forms is regrouped by machine, and the ranks are told that:

- `placement`: for each key of the ring, its local rank among the keys on the same machine (in
  Horovod rank order), the machine's count, and its cross rank among the machines that have that
  local rank, as Horovod's own ``get_host_assignments`` numbers them;
- `machine_rendezvous`: Horovod's elastic rendezvous handler, answering a worker's
  ``rank_and_size`` with those numbers, and serving each key's Gloo ``local_<key>`` scope as its
  machine's (Gloo forms a rank's local ring in the scope named by its ``HOROVOD_HOSTNAME``, which
  must stay the key: Horovod's driver knows the worker by it). A worker asks with the local rank
  it was last told; Horovod's driver knows every key's only slot as 0, so the ask is routed there.

Not for: which keys exist or when (`ElasticLauncher`).
"""

import threading

GET_RANK_AND_SIZE = "rank_and_size"
PUT_WORKER_ADDRESSES = "worker_addresses"
_LOCAL = "local_"


def placement(plan, machine_of):
    """{key: SlotInfo} for the ring `plan` (Horovod's SlotInfos, a key each), the local and
    cross ranks counted by `machine_of(key)`; each SlotInfo's hostname is the machine's scope
    name (``m0``, ``m1``..., in the order of the machines' first ranks)."""
    from horovod.runner.common.util.hosts import SlotInfo

    machines = {}
    for slot in sorted(plan, key=lambda s: s.rank):
        machines.setdefault(machine_of(slot.hostname), []).append(slot)
    names = {machine: f"m{i}" for i, machine in enumerate(machines)}
    placed = {}
    for machine, slots in machines.items():
        for local_rank, slot in enumerate(slots):
            having = [m for m in machines if len(machines[m]) > local_rank]
            placed[slot.hostname] = SlotInfo(
                hostname=names[machine], rank=slot.rank, local_rank=local_rank,
                cross_rank=having.index(machine), size=slot.size, local_size=len(slots),
                cross_size=len(having))
    return placed


def slot_env(placed):
    """The part of a worker's Horovod environment that `placement` corrects."""
    return {"HOROVOD_LOCAL_RANK": str(placed.local_rank),
            "HOROVOD_LOCAL_SIZE": str(placed.local_size),
            "HOROVOD_CROSS_RANK": str(placed.cross_rank),
            "HOROVOD_CROSS_SIZE": str(placed.cross_size)}


def machine_rendezvous(driver, placed_now):
    """Horovod's elastic rendezvous handler class for `driver`, its answers and local scopes by
    machine; `placed_now()` is the current ring's `placement`."""
    from horovod.runner.elastic.rendezvous import create_rendezvous_handler

    class MachineRendezvousHandler(create_rendezvous_handler(driver)):
        def handle(self):
            try:
                super().handle()
            except ConnectionError:
                pass  # the worker that asked was killed before its answer: nobody is left to
                # tell (socketserver printed a BrokenPipeError's traceback on the notebook's stderr)

        def do_GET(self):
            self._route()
            try:
                super().do_GET()
            except threading.BrokenBarrierError:
                # a worker's ``rank_and_size`` waited in Horovod's barrier, which our stop broke
                # (`ElasticLauncher._stop_horovod_later`): the run ends, and the worker with it; an
                # answer, not a traceback on the notebook's stderr
                self.send_status_code(503)

        def do_PUT(self):
            self._route()
            super().do_PUT()

        def do_DELETE(self):
            self._route()
            super().do_DELETE()

        def _route(self):
            parts = self.path.split("/")
            if len(parts) != 3:
                return  # Horovod answers it as a bad request
            _, scope, key = parts
            if scope in (GET_RANK_AND_SIZE, PUT_WORKER_ADDRESSES) and ":" in key:
                key = key.rsplit(":", 1)[0] + ":0"  # a key's only slot, to Horovod's driver
            elif scope.startswith(_LOCAL):
                placed = placed_now()
                for name, slot in placed.items():  # "local_<key>" + a process set's suffix
                    if scope == _LOCAL + name or scope.startswith(f"{_LOCAL}{name}_"):
                        scope = _LOCAL + slot.hostname + scope[len(_LOCAL + name):]
                        break
            self.path = f"/{scope}/{key}"

        def _get_rank_and_size(self, host, local_rank):
            answer = super()._get_rank_and_size(host, local_rank)
            placed = placed_now().get(host)
            rank = int(answer.split(b",", 1)[0])
            if placed is None or placed.rank != rank:  # removed (-1), or not this ring's
                return answer
            return placed.to_response_string().encode("ascii")

    return MachineRendezvousHandler
