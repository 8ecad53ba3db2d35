"""Shared fixtures: a real IPython shell with the extension, real Spark (embedded and standalone)."""

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The suite's JVMs (embedded sessions, the Connect server, the standalone clusters' daemons and
# executors) start, run small jobs and stop: the JIT's first tier alone and the serial collector
# halve their CPU on a 2-core machine (a local[2] session's start and two small jobs: 21.5 s of
# CPU and 8.1 s to start, 12.1 s and 5.7 s with these). Tests only: what hvd_magic starts for a
# user keeps Java's defaults.
def pictures_in(page):
    """The SVG of each picture in a page of HTML (a timeline's are images of their SVG:
    `hvd_magic.timelines.show.kept_picture`)."""
    import base64
    return [base64.b64decode(data).decode() for data in
            re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', page)]


TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
for _variable in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):  # drivers; masters and workers
    os.environ.setdefault(_variable, TEST_JVM_OPTIONS)

# `%load_ext hvd_magic` starts an embedded Spark session in the background; the suite's shells and
# kernels start (or share) the sessions each test asks for instead. test_prestart.py turns it on.
os.environ.setdefault("HVD_MAGIC_PRESTART", "0")

ALLREDUCE_CELL = """\
import torch, horovod.torch as hvd
hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)
print(f"rank {hvd.rank()} of {hvd.size()}: {total.item()}")
total.item()
"""


# `make test` runs two pytest-xdist workers, each given a whole file at a time in the order
# collected. The slowest files (seconds in a serial run, 2026-11-26) go first, so the two workers
# end together rather than one running a long file alone at the end.
SLOW_FIRST = ("test_notebooks", "test_standalone_cluster", "test_failures", "test_elastic",
              "test_browser", "test_first_cell", "test_sessions", "test_connect", "test_multihost",
              "test_ddp", "test_four_hosts", "test_spark_python", "test_live_view")


def pytest_collection_modifyitems(items):
    def weight(item):
        name = item.module.__name__.rsplit(".", 1)[-1]
        return SLOW_FIRST.index(name) if name in SLOW_FIRST else len(SLOW_FIRST)
    items.sort(key=weight)  # stable: a file's own tests keep their order


@pytest.fixture(autouse=True)
def _run_in_tmp(tmp_path, monkeypatch):
    """Each test's run folders land in its own temporary directory."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="session")
def ip():
    from IPython.testing.globalipapp import start_ipython
    shell = start_ipython()
    shell.run_line_magic("load_ext", "hvd_magic")
    os.environ["HVD_MAGIC_NO_WIDGETS"] = "1"
    yield shell


@pytest.fixture
def fresh_ns(ip):
    """The shell's namespace, with what a test added removed afterwards."""
    before = set(ip.user_ns)
    yield ip.user_ns
    for name in set(ip.user_ns) - before:
        del ip.user_ns[name]


def _stop_spark():
    """Stop the active session, and forget the settings of the one that launched the JVM."""
    from pyspark import SparkContext
    sc = SparkContext._active_spark_context
    if sc is not None:
        sc.stop()
        from pyspark.sql import SparkSession
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None
    if SparkContext._jvm is not None:
        # The JVM keeps the settings it was launched with as `spark.*` system properties, and
        # every later SparkConf in it starts from them: a GPU cluster's session that launched it
        # would give the next test's local[4] session tasks that each need a GPU (and never
        # start), a spark.cores.max would bound the next cluster session.
        with contextlib.suppress(Exception):  # (a JVM already ended: nothing lingers)
            system = SparkContext._jvm.System
            for key in list(system.getProperties().stringPropertyNames()):
                if key.startswith("spark."):
                    system.clearProperty(key)


@pytest.fixture(scope="session", autouse=True)
def _data_cache(tmp_path_factory):
    """DataFrames the tests convert (--data) go to a cache of the test run's, not the user's."""
    os.environ["HVD_MAGIC_DATA_CACHE"] = str(tmp_path_factory.mktemp("data-cache"))
    yield
    os.environ.pop("HVD_MAGIC_DATA_CACHE", None)


@pytest.fixture(scope="session", autouse=True)
def _stop_spark_at_exit():
    yield
    _stop_spark()


APT_LOCK = "/tmp/hvd_magic-apt.lock"  # the same for every clone's suite on this machine


def apt_install(*packages, update=False):
    """`apt-get install` Debian packages (root only), one suite at a time: two suites side by side
    on a fresh machine both install Chromium, and the second met dpkg's lock (apt-get exits 100,
    7 browser tests errored). apt's own lock timeout covers any other apt user. Returns
    apt-get's CompletedProcess (output captured)."""
    import fcntl
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    wait = ["-o", "DPkg::Lock::Timeout=600"]
    with open(APT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
        if update:
            subprocess.run(["apt-get", *wait, "update", "-qq"], env=env, capture_output=True)
        return subprocess.run(["apt-get", *wait, "install", "-y", "-qq",
                               "--no-install-recommends", *packages],
                              env=env, capture_output=True, text=True)


def kernel_sockets():
    """Where a test's kernel listens: IPC sockets in a folder of its own. A kernel's TCP ports are
    chosen free and bound later, and another worker's processes took one in between ("Kernel
    died before replying to kernel_info", ZMQError: Address already in use: a fresh clone's
    run); a socket file in our own folder cannot be taken."""
    import tempfile
    return os.path.join(tempfile.mkdtemp(prefix="hvd-kernel-"), "kernel")


def ipc_config():
    """nbclient's configuration for a kernel on IPC sockets (`kernel_sockets`)."""
    from traitlets.config import Config
    return Config({"KernelManager": {"transport": "ipc", "ip": kernel_sockets()}})


def start_kernel(cwd, env):
    """A real IPython kernel (the venv's python3 kernelspec) on IPC sockets; (manager, client)."""
    from jupyter_client.manager import KernelManager
    km = KernelManager(kernel_name="python3", transport="ipc", ip=kernel_sockets())
    km.start_kernel(cwd=str(cwd), env=env)
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
    except BaseException:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        raise
    return km, kc


@contextlib.contextmanager
def cancelled_if_running(run):
    """A background `run` that the block leaves running (a wait or an assertion failed half-way)
    is cancelled and waited for, so that none of its ranks outlives the test."""
    try:
        yield run
    finally:
        if run.state == "running":
            run.cancel()
            run.wait(30)


def ancestry(pid):
    """The processes process `pid` runs under, nearest first: its parents, and for a rank forked
    from a template (`hvd_magic.template`, which lives outside the tree of the task that started
    it) the template's owner, named in its command line, and that one's parents."""
    import psutil

    chain, process = [], psutil.Process(pid).parent()
    while process is not None:
        chain.append(process.pid)
        args = process.cmdline()
        if "hvd_magic.template.server" in args:
            process = psutil.Process(int(args[args.index("hvd_magic.template.server") + 2]))
        else:
            process = process.parent()
    return chain


def logged(log, pattern, server, what, timeout=120):
    """The first match of `pattern` in the file `log`, which `server` (a Popen) writes: how the
    tests learn the port a server picked itself (port 0; a port picked by the tests could be
    taken before the server bound it). Raises if the server exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while True:
        with open(log) as f:
            text = f.read()
        match = re.search(pattern, text)
        if match:
            return match
        if server.poll() is not None or time.monotonic() > deadline:
            why = (f"exited with code {server.returncode}" if server.poll() is not None
                   else f"did not log where it listens in {timeout} s")
            raise RuntimeError(f"{what} {why}; the end of {log}:\n{text[-3000:]}")
        time.sleep(0.2)


def start_mlflow_server(folder, log):
    """``mlflow server`` with a SQLite store in `folder`, its artifacts served by it, on a port it
    picks itself; its output goes to the file `log`. (Its process, its URL) once /health answers
    (the SQLite schema is made before that). tests/test_mlflow.py and bench/bench_scripts.py."""
    with open(log, "w") as out:
        server = subprocess.Popen(
            [os.path.join(os.path.dirname(sys.executable), "mlflow"), "server",
             "--host", "127.0.0.1", "--port", "0", "--workers", "1",
             "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
             "--artifacts-destination", os.path.join(folder, "artifacts")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))
    try:
        url = logged(log, r"running on (http://\S+:\d+)", server, "mlflow server").group(1)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return server, url
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mlflow server did not answer at {url}; see {log}")
                time.sleep(0.2)
    except BaseException:
        os.killpg(server.pid, 9)
        server.wait()
        raise


def _wait_for_workers(ui_port, n, timeout=90, host="127.0.0.1"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{host}:{ui_port}/json/", timeout=2) as r:
                state = json.load(r)
            alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
            if len(alive) >= n:
                return state
        except (OSError, ValueError):  # not up yet; or, while starting, the UI's HTML page
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the standalone cluster did not get {n} workers in {timeout} s")


class StandaloneCluster:
    """A Spark standalone master and workers from pyspark's own jars, on loopback addresses.

    `worker_envs` and `worker_prefixes` (worker index -> extra environment / command prefix, e.g.
    ``["ip", "netns", "exec", NS]``) set up single workers; `master_host` is where the master and
    the driver listen.
    """

    def __init__(self, tmp, worker_hosts=("127.0.0.1", "127.0.0.2"), cores=2, worker_env=None,
                 worker_opts="", master_host="127.0.0.1", worker_envs=None, worker_prefixes=None):
        import pyspark
        self.spark_home = os.path.dirname(pyspark.__file__)
        self.tmp = tmp
        self.port = self.ui_port = self.url = None  # the master's, once it listens (start())
        self.master_host = master_host
        self.procs = []
        self.worker_hosts = worker_hosts
        self.cores = cores
        self.worker_env = worker_env or {}
        self.worker_opts = worker_opts
        self.worker_envs = worker_envs or {}
        self.worker_prefixes = worker_prefixes or {}

    def _spawn(self, name, args, env=None, prefix=()):
        log = open(os.path.join(self.tmp, f"{name}.log"), "w")
        full_env = dict(os.environ, SPARK_HOME=self.spark_home, SPARK_NO_DAEMONIZE="1",
                        PYSPARK_PYTHON=sys.executable, **(env or {}))
        command = list(prefix) + [os.path.join(self.spark_home, "bin", "spark-class")] + args
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=full_env,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self):
        # Port 0: the master binds free ports itself and we read them from its log. (Ports picked
        # here could be taken before it binds: it then moves to the next one, and workers told
        # the first waited for it in vain: seen in a fresh clone's run.)
        master = self._spawn("master", ["org.apache.spark.deploy.master.Master",
                                        "--host", self.master_host, "--port", "0",
                                        "--webui-port", "0"],
                             env={"SPARK_LOCAL_IP": self.master_host})  # its web UI there too
        try:
            self.port, self.ui_port = self._master_ports(master)
            self.url = f"spark://{self.master_host}:{self.port}"
            self.workers = [self._start_worker(i) for i in range(len(self.worker_hosts))]
            _wait_for_workers(self.ui_port, len(self.worker_hosts), host=self.master_host)
        except BaseException:  # the fixture never yields: stop what was started here
            self.stop()
            raise
        return self

    def _master_ports(self, master):
        """The master's RPC and web UI ports, from the lines it logs once each listens."""
        log = os.path.join(self.tmp, "master.log")
        return [int(logged(log, pattern, master, "the standalone master", timeout=60).group(1))
                for pattern in (r"Starting Spark master at spark://\S+:(\d+)",
                                r"MasterWebUI.* started at http://\S+:(\d+)")]

    def _start_worker(self, i):
        host = self.worker_hosts[i]
        env = dict(self.worker_env, **self.worker_envs.get(i, {}),
                   SPARK_LOCAL_IP=host)  # its executors bind there too
        if self.worker_opts:
            env["SPARK_WORKER_OPTS"] = self.worker_opts
        return self._spawn(
            f"worker{i}", ["org.apache.spark.deploy.worker.Worker", self.url,
                           "--host", host, "--cores", str(self.cores), "--memory", "2g",
                           "--webui-port", "0",
                           "--work-dir", os.path.join(self.tmp, f"work{i}")], env=env,
            prefix=self.worker_prefixes.get(i, ()))

    def kill_worker(self, i):
        """SIGKILL worker `i` with its executors and their Python workers (one process group):
        a machine of the cluster gone at once."""
        os.killpg(self.workers[i].pid, 9)
        self.workers[i].wait()

    def restart_worker(self, i):
        """Worker `i` again, as an operator brings a machine back (it registers in seconds)."""
        self.workers[i] = self._start_worker(i)

    def session(self, python=None, wait=True, **conf):
        """A session on this cluster; `python` is what executors run (PYSPARK_PYTHON). With
        `wait`, once every running worker's executor has registered: a test's run must not
        count on their doing so within the launcher's wait (a loaded host's, or the one of a
        worker a test restarted, came 30 s late)."""
        _stop_spark()
        from pyspark.sql import SparkSession
        os.environ["PYSPARK_PYTHON"] = python or sys.executable
        builder = (SparkSession.builder.master(self.url).appName("hvd_magic-tests")
                   .config("spark.driver.host", self.master_host)
                   .config("spark.driver.bindAddress", self.master_host)
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.executor.cores", str(self.cores))
                   .config("spark.executor.memory", "1g")
                   .config("spark.executor.extraJavaOptions", TEST_JVM_OPTIONS))
        for key, value in conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        if wait:
            from hvd_magic.launch.spark import cluster_slots
            slots = self.cores * sum(worker.poll() is None for worker in self.workers)
            deadline = time.monotonic() + 180
            while cluster_slots(session.sparkContext) < slots:
                assert time.monotonic() < deadline, f"{slots} slots never registered in 180 s"
                time.sleep(0.2)
        return session

    def stop(self):
        _stop_spark()
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 15)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()


@pytest.fixture(scope="session")
def project_wheel(tmp_path_factory):
    """The project's wheel, built from this checkout as `pip wheel .` builds it."""
    from own_env import build_wheel
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def env_without_horovod(tmp_path_factory, project_wheel):
    """The python of a user's own environment (tests/own_env.py): the wheel, no Horovod."""
    from own_env import make_env
    return make_env(tmp_path_factory.mktemp("env") / "no-horovod", project_wheel)


@pytest.fixture(scope="session")
def env_without_pyspark(tmp_path_factory, project_wheel):
    """The same, and no pyspark either (one GPU node's notebook: no Spark, no Java)."""
    from own_env import make_env
    return make_env(tmp_path_factory.mktemp("env") / "no-pyspark", project_wheel,
                    without=("horovod", "pyspark", "py4j"))


@pytest.fixture(scope="session")
def _standalone_cluster(tmp_path_factory):
    # (each worker's executors know which worker they are: HVD_TEST_WORKER, for a test whose
    # executors' Python differs by worker: test_standalone_cluster.py's shipping tests)
    cluster = StandaloneCluster(str(tmp_path_factory.mktemp("spark-standalone")),
                                worker_envs={0: {"HVD_TEST_WORKER": "0"},
                                             1: {"HVD_TEST_WORKER": "1"}}).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def standalone(_standalone_cluster):
    """The cluster of two workers, one per test session (per xdist worker) for every file that
    uses it: its start (a master and two worker JVMs) was paid once per file. Each test makes
    and stops a session of its own on it; a worker a test killed and left dead (a test that
    failed before it started the worker again) is started again here."""
    for i, worker in enumerate(_standalone_cluster.workers):
        if worker.poll() is not None:
            _standalone_cluster.restart_worker(i)
    return _standalone_cluster


def spark_session(np):
    """The classic session earlier tests left running (when it has np slots), else a new
    embedded local[np] one, as hvd_magic would start it."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from hvd_magic.launch.spark import embedded_session, local_slots

    sc = SparkContext._active_spark_context
    if sc is not None and (local_slots(sc.master) or 0) >= np:
        return SparkSession.builder.getOrCreate()
    _stop_spark()
    return embedded_session(np)
