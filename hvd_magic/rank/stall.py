"""Rank side of the hang watchdog: tell the driver when this rank waits long for its peers.

Horovod's stall inspector never fires with the Gloo controller, so a rank waiting for peers that
will never join (they finished their loop early, or are busy elsewhere) waits forever; and a rank
in ``hvd.init()`` waits for every peer to call it too, up to several times Gloo's timeout.
torch.distributed's Gloo waits 30 minutes by default. Each wait in Horovod's `init`,
`synchronize`, `join` or `barrier`, and in torch.distributed's `init_process_group`, collectives
(`TORCH_WAITS`), an asynchronous collective's ``Work.wait()`` and, once a
`DistributedDataParallel` exists, `backward` (where DDP's reducer waits for the gradients'
all-reduce), once a tf.distribute `MultiWorkerMirroredStrategy` exists, the calls its
collectives run under, and JAX's (`hvd_magic.rank.jax_waits`), sets a flag (a time check, no
syscall); a monitor thread sends a ``blocked`` event (with the operation) once a wait has
lasted `REPORT_AFTER` seconds and ``unblocked`` when it ends. The driver
(`hvd_magic.driver.watchdog`) compares the ranks.

Each module is patched right after it is imported (`hooks`): nothing is imported here.

An exception that leaves one of those waits is marked as a collective's (`from_collective`):
what a rank failed of is told by cause, not by its words (`code_error`: the code's own socket
that broke as a peer was lost or the run was stopped is the code's error, not a bystander's).

While a peer of a warm session is held in pdb (`hvd_magic.rank.debugger`), a collective waits
before it starts (Horovod's enqueue, ``join``, ``barrier``; torch.distributed's and
tf.distribute's calls above): on our channel, not inside the framework, whose timeouts would
count a person's debugging.
"""

import functools
import threading
import time

from . import debugger, hooks, reporting
from ..compat import tensorflow as tf_compat

REPORT_AFTER = 2.0

_waiting = {"since": None, "op": None, "reported": False}
_lock = threading.Lock()


# torch.distributed's calls that wait for every peer (a call with async_op=True returns at once)
TORCH_WAITS = ("init_process_group", "all_reduce", "broadcast", "all_gather",
               "all_gather_into_tensor", "all_gather_object", "broadcast_object_list", "barrier",
               "monitored_barrier", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather",
               "gather_object", "scatter", "scatter_object_list", "all_to_all",
               "all_to_all_single", "recv")


def _blocking(fn, op, hold=True, began=None):
    """`fn` as a wait named `op`; with `hold`, it waits first while a session peer is in pdb;
    `began(op)` is called where a wait (not one inside another) begins."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if hold:
            debugger.wait_while_held()
        with _lock:
            # a wait inside a wait (all_gather_object calls all_gather) is the outer one's;
            # an asynchronous call waits in its work's wait(), not here
            if _waiting["since"] is not None or kwargs.get("async_op"):
                inner = True
            else:
                inner = False
                _waiting.update(since=time.monotonic(), op=op, reported=False)
                if began is not None:
                    began(op)
        try:  # (here, not in a helper: a stack's innermost call is read past `wrapper`)
            return fn(*args, **kwargs)
        except BaseException as exc:
            _mark(exc, op)
            raise
        finally:
            if not inner:
                with _lock:
                    reported = _waiting["reported"]
                    _waiting.update(since=None, op=None, reported=False)
                if reported:
                    reporting.send({"t": "unblocked"})
    return wrapper


def _mark(exc, op):
    try:
        exc.hvd_magic_collective = op  # (read by `from_collective`)
    except AttributeError:  # (an exception type without a __dict__: not a collective's)
        pass


def from_collective(exc):
    """The collective `exc` (or an exception it was raised from or during) left, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        op = getattr(exc, "hvd_magic_collective", None)
        if op is not None:
            return op
        exc = exc.__cause__ or exc.__context__
    return None


def code_error(exc):
    """Whether `exc` is the code's own: an OSError (a socket's: ``BrokenPipeError``,
    ``ConnectionResetError``...) that no collective raised. Horovod, Gloo and torch.distributed
    raise their transport's errors as RuntimeError (or their own types), never as OSError, so
    words such as "Broken pipe" in one are the code's own connection's."""
    return isinstance(exc, OSError) and from_collective(exc) is None


def _held_first(fn):
    """A collective's enqueue (``allreduce_async``...): not while a peer is held in pdb."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        debugger.wait_while_held()
        return fn(*args, **kwargs)
    return wrapper


def _monitor():
    while True:
        time.sleep(0.5)
        with _lock:
            since, op = _waiting["since"], _waiting["op"]
            due = since is not None and not _waiting["reported"] \
                and time.monotonic() - since >= REPORT_AFTER
            if due:
                _waiting["reported"] = True
        if due:
            reporting.send({"t": "blocked", "op": op, "seconds": time.monotonic() - since})


_monitor_started = threading.Event()


def _start_monitor():
    if not _monitor_started.is_set():
        _monitor_started.set()
        threading.Thread(target=_monitor, name="hvd-magic-stall", daemon=True).start()


def _wrap(module, ops, hold=True, began=None):
    found = {op: getattr(module, op, None) for op in ops}
    hooks.replace(module, {op: _blocking(fn, op, hold, began) for op, fn in found.items()
                           if fn is not None})
    _start_monitor()


def _patch(mpi_ops):
    # Patched in the module the framework's package imports them from, before it does.
    _wrap(mpi_ops, ("init", "join", "barrier"))
    _wrap(mpi_ops, ("synchronize",), hold=False)  # it waits for what an enqueue, held first, began
    hooks.replace(mpi_ops, {name: _held_first(fn) for name, fn in list(vars(mpi_ops).items())
                            if name.endswith(("_async", "_async_")) and callable(fn)})


def _patch_torch(c10d):
    # torch.distributed takes these names from distributed_c10d (``import *``) once it is run
    _wrap(c10d, TORCH_WAITS)
    # a call with async_op=True returns its Work at once; the wait is in Work.wait()
    work = c10d.Work
    if not getattr(work.wait, "_hvd_magic_wait", False):
        work.wait = _blocking(work.wait, "Work.wait", hold=False)  # (as synchronize)
        work.wait._hvd_magic_wait = True


def _patch_ddp(module):
    """The first `DistributedDataParallel` made wraps `torch.autograd.backward` (what
    ``loss.backward()`` calls): its reducer waits there for the peers' gradients. Code without
    DDP keeps an unwrapped backward."""
    ddp = module.DistributedDataParallel
    made = ddp.__init__

    @functools.wraps(made)
    def __init__(self, *args, **kwargs):
        made(self, *args, **kwargs)
        import torch.autograd  # (loaded already: the DDP module needs it)
        if not getattr(torch.autograd.backward, "_hvd_magic_wait", False):
            torch.autograd.backward = _blocking(torch.autograd.backward, "backward")
            torch.autograd.backward._hvd_magic_wait = True

    ddp.__init__ = __init__


def _patch_tf_strategy(module):
    """A `MultiWorkerMirroredStrategy`'s collectives wait inside TensorFlow's runtime, under
    the Python call that runs them: a `tf.function` (Keras' train step) or the strategy's own
    eager `run`, `reduce`, `gather`. Once such a strategy is made, those calls are waits (all
    ranks are in them together while they train; one rank elsewhere for long is the stall).
    TensorFlow without a multi-worker strategy keeps its calls unwrapped."""
    strategy = module.CollectiveAllReduceStrategy
    made = strategy.__init__

    @functools.wraps(made)
    def __init__(self, *args, **kwargs):
        made(self, *args, **kwargs)
        _wrap_tf_waits(strategy)

    strategy.__init__ = __init__


def _wrap_tf_waits(strategy):
    function = tf_compat.function_class()
    if function is not None and not getattr(function.__call__, "_hvd_magic_wait", False):
        function.__call__ = _blocking(function.__call__, "tf.function")
        function.__call__._hvd_magic_wait = True
    for op in ("run", "reduce", "gather"):
        fn = getattr(strategy, op, None)
        if fn is not None and not getattr(fn, "_hvd_magic_wait", False):
            setattr(strategy, op, _blocking(fn, f"strategy.{op}"))
            getattr(strategy, op)._hvd_magic_wait = True
    _start_monitor()


def install():
    for framework in ("torch", "tensorflow"):
        hooks.when_imported(f"horovod.{framework}.mpi_ops", _patch)
    hooks.when_imported("torch.distributed.distributed_c10d", _patch_torch)
    hooks.when_imported("torch.nn.parallel.distributed", _patch_ddp)
    hooks.when_imported("tensorflow", tf_compat.check_modules)
    hooks.when_imported(tf_compat.COLLECTIVE_STRATEGY, _patch_tf_strategy)
