"""Where a rank's environment and rendezvous are made, one module per framework behind one
contract (`base.Framework`): Horovod (`horovod`), torch.distributed (`torch`). Every rank gets
every framework's variables, so a cell may use any of them; none is imported here.

The task code asks this package, never a framework's module by name: the next framework
(`tf.distribute`, JAX) is one new module and one entry in `FRAMEWORKS`.

Not for: IPython, pyspark, the launchers (this runs in Spark tasks and on the rank side).
"""

from .base import Framework, Served, World
from .horovod import Horovod
from .torch import TorchDistributed

FRAMEWORKS = (Horovod(), TorchDistributed())


class Serving:
    """What task 0 serves for every framework: `relay` for the other tasks, `stop` at the end."""

    def __init__(self):
        self.served = {}
        try:
            for framework in FRAMEWORKS:
                served = framework.serve()
                if served is not None:
                    self.served[framework.name] = served
        except BaseException:
            self.stop()
            raise

    @property
    def relay(self):
        return {name: served.relay for name, served in self.served.items()}

    def stop(self):
        for served in self.served.values():
            served.stop()


def rank_env(slot, world, relayed):
    """Every framework's variables for `slot`'s rank; `relayed`: `Serving.relay` of task 0."""
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


__all__ = ["FRAMEWORKS", "Framework", "Served", "Serving", "World", "here", "rank_env"]
