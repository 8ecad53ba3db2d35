"""Horovod's elastic driver's private members (Horovod 0.28.1, its last release; we build it,
but a user may bring another): the elastic timeout it applies, the condition its wait for slots
waits on, its reminder to rank 0 of new hosts, its worker registry's barrier, and the hook a
worker's exit goes through. Each looked up on the driver; where one is missing the launcher does
without it, said once.

Imports Horovod only where the caller already has (`hvd_magic.launch.elastic`).
"""

from . import private, unavailable


def elastic_timeout(driver):
    """The elastic timeout `driver` applies (ours, HOROVOD_ELASTIC_TIMEOUT's or its default), in
    seconds, or None where it does not say."""
    return private(driver, "_timeout", "horovod", "the elastic driver's timeout",
                   "a run that gave up waiting for slots gives the time it waited as its timeout")


def wake_slot_wait(driver):
    """Wake `driver`'s wait for slots (it then sees that it was stopped), or say why not."""
    cond = private(driver, "_wait_hosts_cond", "horovod", "waking the elastic driver's wait for "
                   "slots", "a stopped run waiting for slots ends only at the elastic timeout")
    if cond is None:
        return False
    with cond:
        cond.notify_all()
    return True


def remind_hosts_added(driver):
    """Tell `driver`'s rank 0 again that hosts were added (it resets at its next commit).
    False where the driver has no such call: a rank 0 that missed the first word trains on
    without the new slots until discovery sees another change."""
    notify = getattr(driver, "_notify_workers_host_changes", None)
    hosts = getattr(getattr(driver, "_host_manager", None), "current_hosts", None)
    if notify is None or hosts is None:
        unavailable("horovod", "reminding rank 0 of added hosts",
                    "a slot offered while rank 0 re-initialised may wait for the next change")
        return False
    from horovod.runner.elastic.worker import HostUpdateResult

    notify(hosts, HostUpdateResult.added)
    return True


def break_worker_barrier(driver):
    """Abort the barrier of `driver`'s worker registry, so that none of its threads waits
    forever after a stop; False where there is none to reach."""
    barrier = private(getattr(driver, "_worker_registry", None), "_barrier", "horovod",
                      "the worker registry's barrier",
                      "a stopped elastic run's driver thread may wait until the elastic timeout")
    if barrier is None:
        return False
    barrier.abort()
    return True


def worker_exit_hook(driver_class):
    """The name of the method `driver_class` records a worker's exit in (ours wraps it, so
    that an exit after a stop ends quietly), or None where it has none: then Horovod's
    traceback for such an exit shows under the cell."""
    if not hasattr(driver_class, "_handle_worker_exit"):
        unavailable("horovod", "the elastic driver's worker exit hook",
                    "a worker's exit after a stop shows Horovod's traceback")
        return None
    return "_handle_worker_exit"
