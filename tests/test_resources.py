"""Every rank's CPU, memory and GPUs, sampled by its task (issue #50): the figures are the
process tree's as psutil reads it from outside; a rank that grows past a real cgroup memory
limit is killed by the kernel's OOM killer for real, and the run says "out of memory".

The cgroup tests need the cgroup v1 memory controller and root (this machine has both); they
are skipped with the reason elsewhere. Each makes a child of this process's memory cgroup with a
small limit, and the rank that is to grow moves itself into it first.
"""

import contextlib
import json
import os
import subprocess
import sys
import threading
import time

import psutil
import pytest

import hvd_magic
from conftest import spark_session
from hvd_magic.task.resources import Sampler, _memory_cgroup, named_by_kernel
from hvd_magic.words import size

MB = 1 << 20


def _wait(condition, timeout=60, what="it"):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.1)


def _tree_rss(pid):
    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root] + root.children(recursive=True))


HOLDS = """\
import os, time
if os.environ["RANK"] == "1":
    ballast = b"x" * ({mb} << 20)  # (every page written: resident)
while not os.path.exists({marker!r}):
    time.sleep(0.05)
"""


def test_each_ranks_memory_is_what_psutil_reads_from_outside_and_is_kept(ip, tmp_path):
    marker = str(tmp_path / "go")
    run = ip.run_cell_magic("horovod", "--np -2 --background --quiet",
                            HOLDS.format(mb=200, marker=marker))
    try:
        ballast = run.ranks[1].usage
        _wait(lambda: (ballast.latest or {}).get("rss", 0) > 200 * MB, what="200 MB sampled")
        # (the rank holds its memory now: a sample and a reading from outside agree)
        sampled = ballast.latest["time"]
        _wait(lambda: ballast.latest["time"] > sampled, what="a second sample")
        outside = _tree_rss(run.ranks[1].pid)
        assert abs(ballast.latest["rss"] - outside) < 0.1 * outside
        # each rank its own (a rank forked from the template counts the pages it shares with
        # it, torch's among them: hvd_magic.template)
        assert ballast.latest["rss"] > run.ranks[0].usage.latest["rss"] + 150 * MB
        assert ballast.latest["limit"] > 0 and ballast.latest["free"] > 0
    finally:
        open(marker, "w").close()
    run.wait(60)
    table = run.resources
    assert set(table["rank"]) == {0, 1}
    assert {"time", "cpu", "rss"} <= set(table.columns)
    assert table[table["rank"] == 1]["rss"].max() > 200 * MB
    kept = json.load(open(os.path.join(run.run_dir, "run.json")))["ranks"]
    assert kept[1]["resources"]["peak_rss"] > kept[0]["resources"]["peak_rss"] + 150 * MB
    # a rank that ended shows its peak alone, not its last sample (of a process perhaps gone)
    from hvd_magic.view.dashboard import Dashboard
    dashboard = Dashboard()
    dashboard.start(run)  # (a finished run: nothing is displayed)
    row = dashboard._table_html(run).split("<tr data-rank='1'")[1].split("</tr>")[0]
    assert f">peak {size(run.ranks[1].usage.peak_rss)}</td>" in row, row
    assert "pages it shares with the other ranks" in row  # what the figure counts, on hover
    assert " B (peak" not in row and "MB" in size(run.ranks[1].usage.peak_rss)


def test_a_busy_ranks_cpu_counts_its_child_processes():
    """The rank's tree: a child process that spins counts, one that sleeps does not."""
    spinner = subprocess.Popen([sys.executable, "-c", "import subprocess, sys\n"
                                "subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
                                "import time; time.sleep(600)"])
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        _wait(lambda: len(psutil.Process(spinner.pid).children()) == 1, what="the child")
        child = psutil.Process(spinner.pid).children()[0]
        busy, idle = Sampler(spinner.pid, None), Sampler(sleeper.pid, None)
        busy.sample(), idle.sample()  # (the baseline: CPU is measured between two samples)
        # what the child spent meanwhile, read from outside: at least a second of CPU, however
        # small its share of a loaded host's cores (the samples' window holds this one)
        start, spent = time.monotonic(), sum(child.cpu_times()[:2])
        _wait(lambda: sum(child.cpu_times()[:2]) - spent >= 1.0, timeout=120, what="1 s of CPU")
        share = 100 * (sum(child.cpu_times()[:2]) - spent) / (time.monotonic() - start)
        assert busy.sample()["cpu"] > 0.8 * share and idle.sample()["cpu"] < min(5, share / 2)
    finally:
        for proc in psutil.Process(spinner.pid).children() + [spinner, sleeper]:
            proc.kill()


def test_a_ranks_descendants_are_the_kernels_list_of_every_threads_children():
    """Found without reading every process of the host: a grandchild, and a child that a thread
    other than the main one started, as psutil finds them."""
    from hvd_magic.task.resources import descendants
    script = ("import subprocess, sys, threading, time\n"
              "sleep = [sys.executable, '-c', 'import time; time.sleep(600)']\n"
              "grand = [sys.executable, '-c', 'import subprocess, sys, time; "
              "subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(600)\"]); "
              "time.sleep(600)']\n"
              "subprocess.Popen(grand)\n"
              "threading.Thread(target=subprocess.Popen, args=(sleep,)).start()\n"
              "time.sleep(600)")
    rank = subprocess.Popen([sys.executable, "-c", script])
    try:
        root = psutil.Process(rank.pid)
        _wait(lambda: len(root.children(recursive=True)) == 3, what="three descendants")
        found = {p.pid for p in descendants(root)}
        assert found == {p.pid for p in root.children(recursive=True)}
    finally:
        for proc in psutil.Process(rank.pid).children(recursive=True) + [root]:
            proc.kill()


def test_a_processs_cpu_is_measured_between_samples_never_at_its_first_look():
    """A busy process's first sample read its CPU over the few milliseconds between psutil's
    baseline and the reading: a clock tick in them read 285% for one thread. Its first sample
    counts nothing; every later one is at most what it may use (its cores)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        firsts = [Sampler(spinner.pid, None).sample() for _ in range(10)]
        assert [f["cpu"] for f in firsts] == [0.0] * 10, firsts
        sampler = Sampler(spinner.pid, None)
        sampler.sample()
        time.sleep(1)
        later = sampler.sample()
        assert 0 < later["cpu"] <= 100 * later["cores"] and later["cores"] >= 1, later
    finally:
        spinner.kill()
        spinner.wait()


def test_an_ended_rank_gives_no_sample():
    """A rank that ended (a zombie until its task reaps it) has no memory to count: its sample
    read 0 MB, and every rank's memory line plunged to 0 at its end ("peak 0 B" for a short
    run). None is sent; the driver drops a zero sample an older task sends."""
    from hvd_magic.driver.usage import Usage

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    sampler = Sampler(ended.pid, None)
    _wait(lambda: psutil.Process(ended.pid).status() == psutil.STATUS_ZOMBIE, what="its end")
    assert sampler.sample() is None
    ended.wait()
    usage = Usage()
    usage.add({"t": "resources", "time": 1.0, "cpu": 50.0, "cores": 2, "rss": 100 * MB})
    usage.add({"t": "resources", "time": 2.0, "cpu": 0.0, "cores": 2, "rss": 0})
    assert usage.latest["rss"] == 100 * MB and len(usage.points) == 1
    assert usage.cpu_share() == (25.0, 2)  # a share of the cores it may use


def test_memory_past_its_limit_says_why_in_words():
    """Resident memory counts shared pages in full, the limit once: "at 1.18 GB (its limit:
    1 GB)" and "104% of its limit" read as nonsense, explained only on hover."""
    from hvd_magic.driver.usage import Usage
    from hvd_magic.errors import describe_end
    from hvd_magic.view.table import _usage_cells

    end = describe_end({"status": "died", "oom": {"peak": 1180 * MB, "limit": 1000 * MB,
                                                  "limit_of": "cgroup",
                                                  "by": "its cgroup's OOM killer"}})
    assert "as it reached its limit (its limit: 1000 MB" in end, end
    assert "counting in full the pages it shares" in end and "at 1.2 GB" not in end, end
    usage = Usage()
    usage.add({"t": "resources", "time": 1.0, "cpu": 150.0, "cores": 2, "rss": 1040 * MB,
               "limit": 1000 * MB, "limit_of": "cgroup"})
    cells = _usage_cells(usage)
    assert "at its limit (resident memory counts shared pages in full)" in cells["memory"][0]
    assert "%" not in cells["memory"][0].split("⚠")[1], cells
    assert cells["cpu"][0] == "75%" and "of the 2 cores it may use" in cells["cpu"][1], cells


NVML_FAKE = r"""
/* What NVML says of one GPU: 1 GiB used of 16, 87% busy (this machine has no GPU). */
typedef struct { unsigned long long total, free, used; } memory_t;
typedef struct { unsigned int gpu, memory; } rates_t;
int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) { *h = (void *)(long)(i + 1); return i < 2 ? 0 : 2; }
int nvmlDeviceGetMemoryInfo(void *h, memory_t *m) { m->total = 16ULL << 30; m->used = (long)h << 30; m->free = m->total - m->used; return 0; }
int nvmlDeviceGetUtilizationRates(void *h, rates_t *r) { r->gpu = 87; r->memory = 40; return 0; }
"""


def test_gpus_are_read_through_nvml_without_a_framework(tmp_path, monkeypatch):
    source, library = tmp_path / "nvml.c", tmp_path / "libnvidia-ml.so.1"
    source.write_text(NVML_FAKE)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    monkeypatch.setenv("HVD_MAGIC_NVML", str(library))
    from hvd_magic.task.nvml import Nvml
    sample = Sampler(os.getpid(), None, gpus=["1"]).sample(Nvml())
    assert sample["gpus"] == [{"index": 1, "util": 87, "mem": 2 << 30, "mem_total": 16 << 30}]
    probe = subprocess.run([sys.executable, "-c", "import sys, hvd_magic.task.resources\n"
                            "print(sorted({'torch', 'tensorflow'} & set(sys.modules)))"],
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "[]"


def test_each_ranks_sampler_reads_its_own_gpu_of_the_hosts(ip, tmp_path, monkeypatch):
    """Every rank sees both GPUs (#63); each one's sampler reads its own alone (NVML's GPU 1
    reports 2 GiB used, GPU 0 1 GiB)."""
    source, library = tmp_path / "nvml.c", tmp_path / "libnvidia-ml.so.1"
    source.write_text(NVML_FAKE)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    monkeypatch.setenv("HVD_MAGIC_NVML", str(library))  # (the tasks are the driver's threads)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    marker = str(tmp_path / "go")
    run = ip.run_cell_magic("distributed", "--np -2 --background --quiet",
                            HOLDS.format(mb=0, marker=marker)
                            + "os.environ['CUDA_VISIBLE_DEVICES']")
    try:
        _wait(lambda: all((r.usage.latest or {}).get("gpus") for r in run.ranks),
              what="a sample of each rank's GPU")
        for r in run.ranks:
            assert [(g["index"], g["mem"]) for g in r.usage.latest["gpus"]] == \
                [(r.rank, (r.rank + 1) << 30)]
    finally:
        open(marker, "w").close()
    run.wait(60)
    assert run.results == ["0,1", "0,1"]


# -- out of memory, for real -----------------------------------------------------------------

def _cgroup_v1():
    folder = _memory_cgroup(os.getpid())
    if folder is None or "/memory/" not in folder or not os.access(folder, os.W_OK):
        return None
    return folder


@pytest.fixture
def memory_limit(tmp_path):
    """A memory cgroup of 300 MB, child of this process's; its folder."""
    parent = _cgroup_v1()
    if parent is None:
        pytest.skip("needs the cgroup v1 memory controller, writable (root)")
    folder = os.path.join(parent, f"hvd_magic_test_{os.getpid()}_{tmp_path.name[-12:]}")
    os.mkdir(folder)
    with open(os.path.join(folder, "memory.limit_in_bytes"), "w") as f:
        f.write(str(300 * MB))
    yield folder
    _wait(lambda: not open(os.path.join(folder, "cgroup.procs")).read().strip(),
          what="an empty cgroup")
    os.rmdir(folder)


GROWS = """\
import os, time
if os.environ.get("RANK", os.environ.get("HOROVOD_RANK")) == "1":
    with open({procs!r}, "w") as f:
        f.write(str(os.getpid()))  # into the 300 MB cgroup
    while not os.path.exists({sampled!r}):  # until its task has read that limit (the test says)
        time.sleep(0.05)
    blocks = []
    for _ in range(100):
        blocks.append(b"x" * (20 << 20))
        time.sleep(0.25)  # (80 MB/s: about 4 s to the limit, a sample each second)
else:
    time.sleep(60)
"""


@contextlib.contextmanager
def growing(memory_limit, tmp_path):
    """GROWS for `memory_limit`, and a thread that lets rank 1 grow once its task's sampler has
    seen the rank in the cgroup: so it is its cgroup's limit the rank dies at, not an older
    sample's (the host's), however late the sampler runs on a loaded machine."""
    sampled, before, done = str(tmp_path / "sampled"), hvd_magic.last_run(), threading.Event()

    def watch():
        deadline = time.monotonic() + 60  # then it grows anyway, and the test says what it saw
        while not done.is_set():
            run = hvd_magic.last_run()
            latest = (run.ranks[1].usage.latest or {}) if run is not before else {}
            if latest.get("limit") == 300 * MB or time.monotonic() > deadline:
                open(sampled, "w").close()  # (300 MB: the cgroup's limit, read by the sampler)
                return
            done.wait(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield GROWS.format(procs=os.path.join(memory_limit, "cgroup.procs"), sampled=sampled)
    finally:
        done.set()
        watcher.join()


def test_an_oom_kill_is_named_by_every_cgroup_the_process_was_seen_in(memory_limit):
    """A sample that shows the process elsewhere (a dying process is shown in its hierarchy's
    root a moment before it is a zombie, cgroup v1) does not forget the cgroup it was seen in
    before: its OOM kill there is still its cgroup's, at that cgroup's limit."""
    def move(folder):
        with open(os.path.join(folder, "cgroup.procs"), "w") as f:
            f.write(str(grower.pid))

    grower = subprocess.Popen([sys.executable, "-c", "import sys\nsys.stdin.readline()\n"
                               "blocks = []\nwhile True: blocks.append(b'x' * (20 << 20))"],
                              stdin=subprocess.PIPE)
    try:
        sampler = Sampler(grower.pid, None)
        move(memory_limit)
        assert sampler.sample()["limit"] == 300 * MB
        move(os.path.dirname(memory_limit))  # where the next sample sees it
        assert sampler.sample()["limit"] != 300 * MB
        move(memory_limit)
        grower.stdin.write(b"go\n")
        grower.stdin.flush()
        assert grower.wait(60) == -9
        oom = sampler.oom()
        assert oom["by"] == "its cgroup's OOM killer" and oom["limit"] == 300 * MB, oom
    finally:
        grower.kill()
        grower.wait()


def test_a_sigkill_while_another_process_is_killed_out_of_memory_is_not_one(memory_limit):
    """The host's OOM count rises for any process: here another one, in a cgroup of its own,
    while a second is SIGKILLed by hand (two test suites on one machine did that, fresh-clone
    run Y). The kernel's log names whom its OOM killer killed: not the second."""
    if named_by_kernel(os.getpid()) is None:
        pytest.skip("the kernel's log (/dev/kmsg) cannot be read here")
    victim = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(120)"])
    grower = subprocess.Popen([sys.executable, "-c", "import sys\nsys.stdin.readline()\n"
                               "blocks = []\nwhile True: blocks.append(b'x' * (20 << 20))"],
                              stdin=subprocess.PIPE)
    try:
        sampler = Sampler(victim.pid, None)
        sampler.sample()
        with open(os.path.join(memory_limit, "cgroup.procs"), "w") as f:
            f.write(str(grower.pid))
        grower.stdin.write(b"go\n")
        grower.stdin.flush()
        assert grower.wait(60) == -9
        assert named_by_kernel(grower.pid) is True  # the kernel's own word: an OOM kill
        victim.kill()
        assert victim.wait(10) == -9
        assert sampler.oom() is None
    finally:
        for proc in (victim, grower):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("np", ["-2", "2"])
def test_a_rank_past_its_memory_limit_is_named_out_of_memory(ip, memory_limit, np, tmp_path):
    if np == "2":
        spark_session(2)
    with growing(memory_limit, tmp_path) as cell, pytest.raises(hvd_magic.RankError) as caught:
        ip.run_cell_magic("horovod", f"--np {np} --quiet", cell)
    text = str(caught.value)
    assert caught.value.rank == 1
    assert "out of memory: killed by its cgroup's OOM killer" in text, text
    assert "(its limit: 300 MB" in text, text
    assert "fewer ranks a host" in text, text
    oom = int(open(os.path.join(memory_limit, "memory.oom_control")).read().split()[-1])
    assert oom >= 1  # the kernel's own count: it was the OOM killer
    run = hvd_magic.last_run()
    assert run.ranks[1].usage.peak_rss > 100 * MB  # its climb was seen on the way


def test_a_warm_sessions_rank_out_of_memory_is_named(ip, memory_limit, capsys, tmp_path):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        with growing(memory_limit, tmp_path) as cell, \
                pytest.raises(hvd_magic.RankError) as caught:
            ip.run_cell_magic("horovod", "--quiet", cell.replace("time.sleep(60)", "pass"))
        assert "out of memory: killed by its cgroup's OOM killer" in str(caught.value)
        said = capsys.readouterr()
        assert "ended (out of memory). Run %horovod_session restart" in said.out + said.err
    finally:
        ip.run_line_magic("horovod_session", "stop")


@pytest.mark.parametrize("reason, memory", [
    ("ExecutorLostFailure (executor 2 exited caused by one of the running tasks) Reason: Container "
     "killed by YARN for exceeding physical memory limits. 4.5 GB of 4.5 GB physical memory used.",
     True),
    ("ExecutorLostFailure (executor 1 exited unrelated to the running tasks) Reason: The executor "
     "with id 1 exited with exit code 137(SIGKILL, possible container OOM). The API gave the "
     "following container statuses: container name: spark-kubernetes-executor, terminated "
     "reason: OOMKilled", True),
    ("java.lang.OutOfMemoryError: Java heap space", True),
    ("ExecutorLostFailure (executor 0 exited caused by one of the running tasks) Reason: Command "
     "exited with code 137", False),  # a SIGKILL: by a person as likely as by memory
])
def test_an_executor_lost_for_memory_is_told_from_one_lost_otherwise(reason, memory):
    """What YARN, Kubernetes and the JVM say (this machine has neither cluster manager)."""
    from hvd_magic.errors import is_memory_loss
    assert is_memory_loss(reason) is memory
