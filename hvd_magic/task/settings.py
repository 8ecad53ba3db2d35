"""What a task is given: `TaskSettings` (one small picklable object) and a `Coordinator`, the
task's view of its siblings (Spark's `BarrierTaskContext`, or threads on the driver)."""

import dataclasses


@dataclasses.dataclass
class TaskSettings:
    run_id: str
    np: int
    events_address: str
    token: str
    job: bytes                      # pickled {"fn", "args", "kwargs", "sources"} (small values)
    horovod_env: dict               # HOROVOD_* knobs chosen by the driver
    broadcast_kwargs: dict = dataclasses.field(default_factory=dict)  # name -> Broadcast / bytes
    cwd: str = ""
    allow_retry: bool = False
    extra_env: dict = dataclasses.field(default_factory=dict)
    timeline: bool = False          # record a Horovod timeline on rank 0 for the whole run
    timeline_window: bool = True    # HOROVOD_TIMELINE=DYNAMIC, for `hvd_magic.timeline()` blocks
    profile: dict = None            # --timeline of torch without Horovod: skip, steps, budget
    session: bool = False           # a warm session: the rank takes cells until stopped
    connect: bool = False           # Spark Connect: the executors may not reach the driver
    executor_cores: int = None      # cores an executor has for ranks; None: its host's (threads.py)
    fork: bool = False              # fork the rank from this host's template (task/spawn.py)
    shipment: tuple = ()            # the notebook's packages sent to the executors (shipped.py)


class Coordinator:
    """What a task needs from its siblings; Spark's BarrierTaskContext or threads on the driver."""

    partition_id: int
    attempt: int

    def task_address(self, partition_id: int) -> str:
        """The host the cluster knows this task's executor by (reachable from the others)."""
        raise NotImplementedError

    def gpus(self) -> list:
        return []

    def executor(self) -> str:
        return self.executor_of(self.partition_id)

    def executor_of(self, partition_id: int) -> str:
        """The executor a task runs in (tasks of one executor share its cores)."""
        return "driver"


class SparkCoordinator(Coordinator):
    def __init__(self):
        from pyspark import BarrierTaskContext
        self.ctx = BarrierTaskContext.get()
        self.partition_id = self.ctx.partitionId()
        self.attempt = self.ctx.attemptNumber()

    def task_address(self, partition_id):
        return self.ctx.getTaskInfos()[partition_id].address.rsplit(":", 1)[0]

    def executor_of(self, partition_id):
        return self.ctx.getTaskInfos()[partition_id].address

    def gpus(self):
        resource = self.ctx.resources().get("gpu")
        return list(resource.addresses) if resource is not None else []
