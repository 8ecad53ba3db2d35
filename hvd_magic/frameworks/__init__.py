"""Where a rank's environment and rendezvous are made, one module per framework behind one
contract (`base.Framework`): Horovod (`horovod`), torch.distributed (`torch`), tf.distribute
(`tensorflow`), JAX (`jax`). Every rank gets every framework's variables, so a cell may use any of them;
none is imported here.

The task code asks this package, never a framework's module by name: the next framework is
one new module and one entry in `FRAMEWORKS`.

Not for: IPython, pyspark, the launchers (this runs in Spark tasks and on the rank side).
"""

from .base import Framework, Served, World
from .horovod import Horovod
from .jax import JaxDistributed
from .tensorflow import TensorFlowDistributed
from .torch import TorchDistributed

FRAMEWORKS = (Horovod(), TorchDistributed(), TensorFlowDistributed(), JaxDistributed())


class Serving:
    """What one task holds for every framework, from before its rank starts to its end: task 0's
    `serve` (`first`) and every task's `reserve`. `message` is the task's ``rendezvous`` event
    (its values for the driver to gather, with what the task says of its GPUs, which every task
    is relayed as ``relayed["gpus"]["tasks"]``: `hvd_magic.task.gpus.task_gpus`); `stop`
    releases it all."""

    def __init__(self, slot, first, gpus=None):
        self.served, self.reserved = {}, {}
        self.gpus = gpus
        try:
            for framework in FRAMEWORKS:
                served = framework.serve() if first else None
                if served is not None:
                    self.served[framework.name] = served
                reserved = framework.reserve(slot)
                if reserved is not None:
                    self.reserved[framework.name] = reserved
        except BaseException:
            self.stop()
            raise

    @property
    def message(self):
        return {"t": "rendezvous",
                "relay": {name: served.relay for name, served in self.served.items()},
                "own": {**{name: reserved.relay for name, reserved in self.reserved.items()},
                        "gpus": self.gpus}}

    def stop(self):
        for held in (*self.served.values(), *self.reserved.values()):
            held.stop()


class Gathering:
    """Every task's ``rendezvous`` event (`Serving.message`) until all `np` are in: then what
    each task is relayed, by framework: task 0's served values and ``"tasks"``, every task's own
    reserved value in rank order. Used by the driver (and by offline tasks, on ``allGather``)."""

    def __init__(self, np):
        self.np = np
        self.events = {}

    def add(self, rank, event):
        """The relay once `event` completes the set, else None. It starts over then: a stage
        Spark retried sends a new set."""
        self.events[rank] = event
        if len(self.events) < self.np:
            return None
        events, self.events = self.events, {}
        relayed = {name: dict(values) for name, values in (events[0].get("relay") or {}).items()}
        owned = {name for event in events.values() for name in (event.get("own") or {})}
        for name in owned:
            relayed.setdefault(name, {})["tasks"] = [
                (events[r].get("own") or {}).get(name) for r in range(self.np)]
        return relayed


def rank_env(slot, world, relayed):
    """Every framework's variables for `slot`'s rank; `relayed`: what `Gathering` relayed."""
    env = {}
    for framework in FRAMEWORKS:
        env.update(framework.rank_env(slot, world, (relayed or {}).get(framework.name, {})))
    return {k: str(v) for k, v in env.items()}


def here(env):
    """What only this host can add to a rank's environment made elsewhere (elastic runs)."""
    extra = {}
    for framework in FRAMEWORKS:
        extra.update(framework.here(env))
    return extra


__all__ = ["FRAMEWORKS", "Framework", "Gathering", "Served", "Serving", "World", "here",
           "rank_env"]
