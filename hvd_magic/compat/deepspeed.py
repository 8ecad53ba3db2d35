"""DeepSpeed's private pieces hvd_magic uses: which of its ops it may build
(``deepspeed.ops.__compatible_ops__``, filled at import).

On a host without a C++ compiler, ``deepspeed.init_distributed()`` on CPU ranks dies building
its shared-memory collectives op (``deepspeed_shm_comm``), though DeepSpeed runs without it when
the op is marked incompatible (torch.distributed's own all-reduce then). Where this DeepSpeed
keeps no such table, the op is left to fail as DeepSpeed's own would, and that is said once.
"""

from . import unavailable


def skip_op(name, why):
    """Mark DeepSpeed's op `name` as one this host cannot build, so DeepSpeed goes on without it
    where it can. Returns whether it is marked."""
    import deepspeed.ops
    table = getattr(deepspeed.ops, "__compatible_ops__", None)
    if not isinstance(table, dict):
        unavailable("deepspeed", "going on without an op (deepspeed.ops.__compatible_ops__)",
                    f"{name} is built anyway and fails: {why}")
        return False
    table[name] = False
    return True
