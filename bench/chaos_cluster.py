"""The standalone cluster of bench/chaos.py's "cluster" launcher (two simulated hosts, a worker
on each), and what its faults do to it: a worker or executor killed, the hosts cut apart."""

import atexit
import os
import shutil
import signal
import sys
import tempfile
import time

from chaos_leaks import _command


class Cluster:
    """The standalone cluster of the "cluster" launcher (tests/conftest.py's, two workers of two
    cores on loopback addresses: the suite's), started at its first round and kept; its session
    made again where another launcher's took its place."""

    def __init__(self):
        self.cluster = self.folder = None
        self.down = None  # the worker a round killed and did not start again

    def use(self):
        from pyspark import SparkContext
        if self.cluster is None:
            self._start()
        sc = SparkContext._active_spark_context
        if sc is None or sc.master != self.cluster.url:
            self.cluster.session()  # (stops the session there was)

    def _start(self):
        """Two simulated hosts (tests/simhosts.py: the root network namespace and one more on a
        bridge), a worker on each; loopback addresses where namespaces cannot be made."""
        import contextlib
        tests = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "tests")
        sys.path.insert(0, tests)
        import simhosts
        from conftest import StandaloneCluster
        self.folder = tempfile.mkdtemp(prefix="chaos-cluster-")
        self.hosts = contextlib.ExitStack()
        atexit.register(self.stop)
        if simhosts.unavailable() is None:
            root, other = self.hosts.enter_context(simhosts.simulated_hosts(2))
            self.link = f"hvr{os.getpid()}x1"  # the other host's cable (its veth's bridge end)
            self.cluster = StandaloneCluster(self.folder,
                                             worker_hosts=(root.address, other.address),
                                             master_host=root.address,
                                             worker_prefixes={1: other.prefix}).start()
        else:
            self.link = None
            self.cluster = StandaloneCluster(self.folder).start()

    def cut(self, seconds, seen):
        """The second host cut off from the first (its link down) for `seconds`, then back;
        `seen` (a dict) gets when the link was read back down ("at") and up again ("healed")."""
        import simhosts
        simhosts.ip("link", "set", self.link, "down")
        try:
            if "state DOWN" in simhosts.ip("link", "show", self.link).stdout:
                seen["at"] = time.monotonic()  # (the host's own word: its link is down)
            time.sleep(seconds)
        finally:
            simhosts.ip("link", "set", self.link, "up")
            seen["healed"] = time.monotonic()

    def lend(self):
        """Its cores freed for another application (the soak's session stopped); what that
        application's session is to be built with: {"master": ..., "conf": {...}}."""
        if self.cluster is None:
            self._start()
        from conftest import TEST_JVM_OPTIONS
        self.leave()
        return {"master": self.cluster.url,
                "conf": {"spark.driver.host": self.cluster.master_host,
                         "spark.driver.bindAddress": self.cluster.master_host,
                         "spark.ui.enabled": "false",
                         "spark.executor.cores": str(self.cluster.cores),
                         "spark.executor.memory": "1g",
                         "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS,
                         "spark.pyspark.python": sys.executable}}

    def leave(self):
        """The cluster's session stopped (a local one comes next)."""
        from pyspark import SparkContext
        sc = SparkContext._active_spark_context
        if self.cluster is not None and sc is not None and sc.master == self.cluster.url:
            from pyspark.sql import SparkSession
            SparkSession.builder.getOrCreate().stop()

    def kill_worker_of(self, pid, run, back):
        """SIGKILL the worker (its executor, Python workers and ranks) that runs rank process
        `pid`; with `back`, started again a moment later (an elastic run grows back); the ranks
        that were on it."""
        from conftest import ancestry
        chain = ancestry(pid)
        index = next(i for i, w in enumerate(self.cluster.workers) if w.pid in chain)
        lost = [r.rank for r in run.ranks
                if r.pid and _under(r.pid, self.cluster.workers[index].pid)]
        rings = [c for c in run.membership or () if c["t"] == "ring"]
        world = rings[-1]["slots"] if rings else []
        self.cluster.kill_worker(index)
        if back:
            time.sleep(1.0)
            self.cluster.restart_worker(index)
        else:
            self.down = index
        return lost, (set(world) <= set(lost)) if world else None  # (None: no world yet)

    def kill_executor_of(self, pid, run):
        """SIGKILL the executor JVM that runs rank process `pid`; the ranks it had."""
        from conftest import ancestry
        executor = next(p for p in ancestry(pid)
                        if "CoarseGrainedExecutorBackend" in _command(p, whole=True))
        lost = [r.rank for r in run.ranks if r.pid and _under(r.pid, executor)]
        os.kill(executor, signal.SIGKILL)
        return lost

    def mend(self):
        """The worker a round killed started again, and every slot registered."""
        from hvd_magic.launch.spark import cluster_slots
        from pyspark import SparkContext
        if self.cluster is None:
            return
        if self.down is not None:
            self.cluster.restart_worker(self.down)
            self.down = None
        sc = SparkContext._active_spark_context
        if sc is not None and sc.master == self.cluster.url:
            ready_by = time.monotonic() + 180
            while cluster_slots(sc) < 4 and time.monotonic() < ready_by:
                time.sleep(0.2)

    def stop(self):
        if self.cluster is not None:
            self.cluster.stop()
            self.hosts.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            self.cluster = None


CLUSTER = Cluster()


def _under(pid, ancestor):
    from conftest import ancestry
    try:
        return ancestor in ancestry(pid)
    except Exception:  # noqa: BLE001  (it is gone)
        return False

