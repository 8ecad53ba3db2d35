"""One slot of an elastic run on Spark: a plain (non-barrier) task that holds a place for a rank.

A barrier stage cannot lose a task without Spark aborting all of them, so an elastic run gives
each slot a Spark job of its own with one plain task (`hvd_magic.launch.elastic.spark`). The task:

1. connects to the driver and says it is there (``slot``: its host, its Spark attempt): the
   driver's discovery now offers this slot to Horovod's elastic driver;
2. waits for the driver's order to start a worker (``worker``: the Horovod host key and the
   environment Horovod's driver made for it), and runs our rank process with it
   (`runner.run_worker`), streaming its events as in every run;
3. when the rank process dies (a signal, a crash), offers the slot again and waits for another
   order; when it finished, raised or was stopped, returns its outcome to Spark; ``slots_done``
   (the run ended) or ``stop`` while it waits returns at once.

An executor that is lost takes its tasks with it (the rank processes die with their parent); the
driver hears the connection end, and Spark starts the task again wherever it has capacity: a
retried task offers its slot anew, and its rank joins at the next commit.

Not for: deciding anything (Horovod's driver and `ElasticSparkLauncher` do), or IPython/pyspark
imports at module level.
"""

import os
import queue
import socket
import types

from .. import frameworks
from ..frameworks.base import iface_towards
from ..rank import elastic_world
from .gpus import spark_ids_once
from .link import DriverLink
from .plan import _local_ip_towards, machine_name
from .runner import run_worker, unshippable

WAIT_STEP = 0.2  # seconds between looks at the driver link while the slot waits for an order


def elastic_slot_task(settings, slots):
    """The function of a slot's one-task Spark job (module level: it pickles by reference)."""
    from pyspark import SparkFiles, TaskContext

    context = TaskContext.get()
    gpu = context.resources().get("gpu")
    # (a slot's task has no siblings to read Spark's addresses with: the executor's first slot
    # reads them, its later ones the same way: task/gpus.py)
    addresses = list(gpu.addresses) if gpu is not None else []
    ids = spark_ids_once(addresses, os.environ.get("CUDA_VISIBLE_DEVICES"),
                         SparkFiles.getRootDirectory())
    for slot in slots:
        yield run_slot(settings, slot, context.attemptNumber(), list(ids.values()))


def run_slot(settings, slot, attempt=0, gpus=()):
    """Hold `slot` until a worker in it finished; its ``(slot, status, payload)``."""
    link = DriverLink(settings, slot)
    orders = queue.Queue()

    def on_order(order):
        if order.get("t") == "stop_worker" and order.get("slot") == slot:
            link.stop_rank()  # Horovod's driver ends this worker (its host went away)
        else:
            orders.put(order)

    link.on_order = on_order
    host = socket.gethostname()
    try:
        refused = unshippable(settings, link, slot, host)
        if refused is not None:
            return refused
        while True:
            link.forward.send({"t": "slot", "host": host, "machine": machine_name(),
                               "attempt": attempt})
            order = _next_order(link, orders, slot)
            if order is None:
                return (slot, "unused", {"rank": slot, "host": host})
            env = dict(order["env"])
            env.update(frameworks.here(env))  # (Horovod's interface, seen from this executor)
            if env.get(elastic_world.ELASTIC) == "torch":  # this machine, as the ranks reach it
                driver = settings.events_address.rsplit(":", 1)[0]
                env.setdefault(elastic_world.ADDRESS, _local_ip_towards(driver))
                env.setdefault("GLOO_SOCKET_IFNAME", iface_towards(driver))
            local_rank = int(env.get("HOROVOD_LOCAL_RANK", env.get("LOCAL_RANK", 0)))
            outcome = run_worker(settings, types.SimpleNamespace(rank=slot, local_rank=local_rank), env,
                                 executor=order["key"], partition=attempt, link=link, gpus=gpus,
                                 ranks_on_host=order.get("ranks_on_host", 1))
            if outcome[1] != "died" or link.stopping.is_set():
                return outcome
    finally:
        link.close()


def _next_order(link, orders, slot):
    """The driver's order to start a worker in `slot`; None once the run ended or stops."""
    while not link.stopping.is_set():
        try:
            order = orders.get(timeout=WAIT_STEP)
        except queue.Empty:
            continue
        if order.get("t") == "slots_done":
            return None
        if order.get("t") == "worker" and order.get("slot") == slot:
            return order
    return None
