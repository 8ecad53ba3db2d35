"""Failures, interrupts and timeouts: never hang, never leave a process behind, show the first
real error. Real ranks, real Horovod, real signals."""

import os
import re
import signal
import threading
import time
import types

import psutil
import pytest

import hvd_magic
from hvd_magic.errors import is_peer_gone
from hvd_magic.view import TextView

SLEEPERS = """\
import os, time
import horovod.torch as hvd
hvd.init()
for step in range(600):
    if hvd.rank() == {bad} and step == 3:
        {action}
    time.sleep({pause})
"""


def rank_processes_left(run):
    """Recorded rank PIDs that still exist (zombies excluded)."""
    alive = []
    for r in run.ranks:
        if r.pid is None:
            continue
        try:
            if psutil.Process(r.pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(r.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def our_children():
    """Rank processes still running anywhere below this process (Spark's workers included)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "hvd_magic.rank" in " ".join(p.cmdline()):
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return found


def wait_for_files(run, paths, timeout=120):
    """Wait until every file of `paths` exists: each written by a rank once it got somewhere."""
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        assert run.state == "running", f"the run ended {run.state} first: {run.error}"
        assert time.monotonic() < deadline, [str(p) for p in paths if not os.path.exists(p)]
        time.sleep(0.05)


def run_cell(ip, options, cell):
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", f"--quiet {options}", cell)
    return info.value, "\n".join(info.value._render_traceback_())


@pytest.mark.parametrize("np", [2, -3])
def test_first_real_error_stops_the_others_fast(ip, np):
    cell = SLEEPERS.format(bad=1, action="raise ValueError('bad batch at step 3')", pause=0.2)
    if np > 0:
        ip.run_cell_magic("horovod", f"--np {np} --quiet", "1")  # a warm session, as users have
    err, text = run_cell(ip, f"--np {np}", cell)
    assert err.rank == 1
    assert "ValueError: bad batch at step 3" in text
    assert "raise ValueError('bad batch at step 3')" in text  # the user's line
    assert "rank 0: stopped" in text
    run = hvd_magic.last_run()
    assert run.state == "failed"
    # a bystander: "cancelled" is the user's. Stopped, not ended by itself: the others sleep for
    # 2 minutes, and a rank that ran its cell to the end says "done"
    assert [r.state for r in run.ranks][0] == "stopped"
    assert rank_processes_left(run) == []


@pytest.mark.parametrize("action, words", [
    ("os.kill(os.getpid(), 9)", ["rank 1", "SIGKILL"]),
    ("os._exit(3)", ["rank 1", "exited with code 3"]),
    ("import ctypes; ctypes.string_at(0)", ["rank 1", "SIGSEGV", "Segmentation fault"]),
])
def test_a_rank_that_dies_is_named_with_its_cause(ip, action, words):
    cell = SLEEPERS.format(bad=1, action=action, pause=0.1)
    err, text = run_cell(ip, "--np -2", cell)
    assert err.rank == 1
    for word in words:
        assert word in text, text
    # the survivor's follow-on error is not shown as the cause
    assert "HorovodInternalError" not in text.split("--- the other ranks ---")[0]
    run = hvd_magic.last_run()
    assert rank_processes_left(run) == []
    # the survivor is a bystander, "stopped" in every view; what Gloo said of its vanished peer
    # stays in its log, never its last line
    assert run.ranks[0].state == "stopped" and "rank 0: stopped" in text, text
    assert not is_peer_gone(run.ranks[0].last_line), run.ranks[0].last_line


@pytest.mark.parametrize("line", [
    "[2026-11-25 10:00:00.123456: E /tmp/pip-req-build-x1/horovod/common/operations.cc:697] "
    "Horovod background loop uncaught exception: [/tmp/pip-req-build-x1/third_party/gloo/gloo/"
    "transport/tcp/pair.cc:589] Read error [127.0.0.1]:46117: Connection reset by peer",
    "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
    "  what():  [/tmp/pip-req-build-x1/third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error",
    "horovod.common.exceptions.HorovodInternalError: ... Connection closed by peer [127.0.0.1]:1",
])
def test_a_peer_gone_line_is_never_a_last_line(line):
    from hvd_magic.driver.apply import apply_event
    from hvd_magic.driver.ranks import RankState

    assert is_peer_gone(line)
    assert not is_peer_gone("epoch 3: loss 0.25") and not is_peer_gone("what a run")
    folder = types.SimpleNamespace(write_lines=lambda rank, lines: None, record=lambda e: None)
    run = types.SimpleNamespace(np=1, ranks=[RankState(0)], folder=folder, view=None,
                                elastic=None)
    apply_event(run, {"t": "lines", "rank": 0, "lines": ["epoch 3: loss 0.25", line]}, None)
    assert run.ranks[0].last_line == "epoch 3: loss 0.25" and run.ranks[0].lines == 2
    # the dashboard's row, drawn from the raw tail, says the same
    from hvd_magic.view.table import last_line
    assert last_line([("stdout", "epoch 3: loss 0.25"), ("stderr", line)]) == "epoch 3: loss 0.25"


def test_timeout_stops_every_rank_and_says_what_they_were_doing(ip):
    cell = ("import time, hvd_magic\nfor step in range(1000):\n"
            "    print(f'working on step {step}')\n"
            "    hvd_magic.report(step=step, total=1000)\n    time.sleep(0.2)\n")
    with pytest.raises(hvd_magic.RunTimeout) as info:  # (the cell runs for 200 s)
        ip.run_cell_magic("horovod", "--np -2 --quiet --timeout 4", cell)
    text = str(info.value)
    assert "--timeout of 4 s" in text
    assert "working on step" in text and "step " in text
    assert "'working on step" not in text  # a line as printed, not a Python repr
    run = hvd_magic.last_run()
    assert run.state == "timeout"
    # stopped at the timeout, not ended by themselves (they would say "done")
    assert [r.state for r in run.ranks] == ["stopped", "stopped"]
    assert rank_processes_left(run) == []


HANG = """\
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))

def load_batch():
    time.sleep(600)

if dist.get_rank() == 1:
    load_batch()
dist.all_reduce(torch.ones(1))
"""


def test_a_timeout_on_a_hang_says_where_every_rank_was(ip):
    """A --timeout shorter than the stall timeout on a hang: the error itself says where each
    rank was (their stacks, grouped, and their places in the collectives), once; it said only
    "nothing printed" of each, though the stacks had been taken."""
    with pytest.raises(hvd_magic.RunTimeout) as info:
        ip.run_cell_magic("horovod", "--np -2 --quiet --timeout 12", HANG)
    text = "\n".join(info.value._render_traceback_())
    assert "--timeout of 12 s" in text
    assert text.count("Where each rank was:") == 1, text
    assert "rank 1: Cell In[" in text and "in load_batch" in text, text
    assert "rank 0: Cell In[" in text and "all_reduce" in text, text
    assert "stacks.txt" in text


def test_a_rank_waiting_with_no_cpu_outside_a_collective_is_a_stall(ip, tmp_path):
    """A rank that waits on something outside the ranks (a DeepSpeed cell sat 7 minutes on a
    build lock at 0% CPU, "running", nothing said): a stall, with where it waits."""
    import fcntl

    lock = tmp_path / "build.lock"
    lock.touch()
    cell = ("import fcntl\n"
            "def wait_for_the_build_lock():\n"
            f"    with open({str(lock)!r}) as f:\n"
            "        fcntl.flock(f, fcntl.LOCK_EX)\n"
            "wait_for_the_build_lock()\n")
    with open(lock) as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # (held by another process: this one)
        err, text = run_cell(ip, "--np -2 --stall-timeout 3 --on-stall fail --timeout 120", cell)
    assert isinstance(err, hvd_magic.RunStalled), text
    # (named as they cross the stall timeout: both, or the first, whose peer follows)
    assert re.search(r"ranks? [01, ]+ ha(?:s|ve) used no CPU for \d+ s, in no collective", text)
    assert "ranks 0-1: Cell In[" in text and "in wait_for_the_build_lock" in text, text
    assert hvd_magic.last_run().stop_reason == "stalled"


def test_a_rank_failing_only_because_the_timeout_stopped_its_peer_is_no_cause(ip, tmp_path):
    """Rank 1 goes at the timeout's stop; rank 0, in a collective with it, ignores that stop
    (as a rank whose stop comes a moment later on a busy cluster) and fails with Horovod's
    follow-on error. The run still ends with its timeout, rank 0 stopped. The timeout comes
    (`Run.expire`) once each rank has written its file: rank 0 ignores SIGTERM and has begun its
    allreduce, rank 1 is about to sleep (a deadline of a few seconds could pass before, on a
    loaded machine, and the stop would find rank 0 still heeding SIGTERM)."""
    cell = (f"import os, signal, time, torch, horovod.torch as hvd\nhvd.init()\n"
            f"if hvd.rank() == 0:\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            f"    pending = hvd.allreduce_async(torch.ones(1), name='never')\n"
            f"open(os.path.join({str(tmp_path)!r}, f'rank-{{hvd.rank()}}'), 'w').close()\n"
            f"if hvd.rank() == 0:\n    hvd.synchronize(pending)\n"
            f"time.sleep(600)\n")
    run = ip.run_cell_magic("horovod", "--np -2 --quiet --background --timeout 600", cell)
    wait_for_files(run, [tmp_path / "rank-0", tmp_path / "rank-1"])
    run.expire()
    with pytest.raises(hvd_magic.RunTimeout, match="--timeout of 600 s"):
        run.wait(timeout=60)
    assert hvd_magic.last_run() is run and run.state == "timeout"
    assert [f["type"] for f in run.failures] == ["HorovodInternalError"]  # what it failed with
    assert [r.state for r in run.ranks] == ["stopped", "stopped"]
    assert rank_processes_left(run) == []


def test_a_rank_failing_only_because_a_cancel_stopped_its_peer_is_cancelled_too(tmp_path):
    """The same order under a user's cancel: both rows say "cancelled", the error RunCancelled
    (a fresh clone's browser test once showed one row "cancelled" and the other "stopped").
    The cancel comes once each rank has written its file: rank 0 ignores SIGTERM and has begun
    its allreduce, rank 1 is about to sleep."""
    def cell(folder):
        import os
        import signal
        import time
        import torch
        import horovod.torch as hvd
        hvd.init()
        if hvd.rank() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            pending = hvd.allreduce_async(torch.ones(1), name="never")
        open(os.path.join(folder, f"rank-{hvd.rank()}"), "w").close()
        if hvd.rank() == 0:
            hvd.synchronize(pending)
        time.sleep(600)

    run = hvd_magic.run(cell, np=-2, args=(str(tmp_path),), background=True,
                        view=TextView(quiet=True))
    wait_for_files(run, [tmp_path / "rank-0", tmp_path / "rank-1"])
    run.cancel()
    with pytest.raises(hvd_magic.RunCancelled):
        run.wait(timeout=60)
    assert [f["type"] for f in run.failures] == ["HorovodInternalError"]
    assert [r.state for r in run.ranks] == ["cancelled", "cancelled"]


def test_interrupt_cancels_spark_job_and_the_next_cell_works(ip, tmp_path):
    """SIGINT reaches the driver as Jupyter delivers an interrupt (a KeyboardInterrupt in the
    main thread), during a Spark run: once both ranks, in their Spark tasks, have written their
    file."""
    cell = (f"import os, time\nopen(os.path.join({str(tmp_path)!r}, 'rank-' + "
            "os.environ['HOROVOD_RANK']), 'w').close()\n"
            "for _ in range(600):\n    time.sleep(0.1)\n")
    ip.run_cell_magic("horovod", "--np 2 --quiet", "1")  # warm session
    # (said if the interrupt is lost: a fresh clone's run lost it once)
    handler = signal.getsignal(signal.SIGINT)
    files, done, interrupted = [tmp_path / "rank-0", tmp_path / "rank-1"], threading.Event(), []

    def interrupt_once_both_run():
        while not done.wait(0.05):
            if all(f.exists() for f in files):
                interrupted.append(hvd_magic.last_run())
                os.kill(os.getpid(), signal.SIGINT)
                return

    helper = threading.Thread(target=interrupt_once_both_run, daemon=True)
    helper.start()
    try:
        ip.run_cell_magic("horovod", "--np 2 --quiet", cell)
    except hvd_magic.RunCancelled:
        pass
    else:
        run = hvd_magic.last_run()
        pytest.fail(f"not cancelled (interrupted: {bool(interrupted)}): run {run.state} on "
                    f"{run.where}, SIGINT's handler {handler!r} "
                    f"({getattr(handler, '__module__', '')}), "
                    f"now {signal.getsignal(signal.SIGINT)!r}")
    finally:
        done.set()
        helper.join()
    run = hvd_magic.last_run()
    assert interrupted == [run]  # (the run the files came from)
    assert run.state == "cancelled"
    assert rank_processes_left(run) == []
    assert ip.run_cell_magic("horovod", "--np 2 --quiet", "6 * 7") == 42


@pytest.mark.parametrize("left", [signal.SIG_IGN, signal.SIG_DFL], ids=["ignored", "default"])
def test_an_interrupt_cancels_a_run_whatever_handler_a_library_left(ip, left):
    """Lightning's Trainer leaves SIGINT ignored after a KeyboardInterrupt (and at the default,
    which would end the process, in its _destroy_dist_connection). A run still stops at an
    interrupt, and the handler is put back after it."""
    cell = "import time\nfor _ in range(600):\n    time.sleep(0.1)\n"
    previous = hvd_magic.last_run()

    def interrupt_once_running():  # (not sooner: the handler is the library's until the launch)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            run = hvd_magic.last_run()
            if run is not previous and run.ranks and all(r.state == "running" for r in run.ranks):
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.05)

    before = signal.signal(signal.SIGINT, left)
    try:
        threading.Thread(target=interrupt_once_running, daemon=True).start()
        with pytest.raises(hvd_magic.RunCancelled):  # (not cancelled, the cell runs a minute)
            ip.run_cell_magic("horovod", "--np -2 --quiet", cell)
        assert signal.getsignal(signal.SIGINT) == left
    finally:
        signal.signal(signal.SIGINT, before)
    assert hvd_magic.last_run().state == "cancelled"


def test_repeated_cancels_leave_nothing_behind():
    """20 runs cancelled mid-way (driver-only and Spark): a census of the processes and threads
    of ours before and after."""
    threads_before = {t.name for t in threading.enumerate()}

    def slow():
        import time
        import horovod.torch as hvd
        hvd.init()
        import hvd_magic
        hvd_magic.report(step=0, total=1)
        time.sleep(600)

    for i in range(20):
        np = -2 if i % 2 else 2
        run = hvd_magic.run(slow, np=np, background=True, view=TextView(quiet=True))
        deadline = time.monotonic() + 60
        while not all(r.pid and r.state == "running" for r in run.ranks):
            assert time.monotonic() < deadline, [r.state for r in run.ranks]
            time.sleep(0.05)
        pids = [r.pid for r in run.ranks]
        run.cancel()
        with pytest.raises(hvd_magic.RunCancelled):
            run.wait(timeout=30)
        assert run.state == "cancelled"
        assert all(not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE
                   for p in pids)
    assert our_children() == []
    left = {t.name for t in threading.enumerate()} - threads_before
    assert not [n for n in left if n.startswith("hvd-magic")], left


def test_watchdog_names_the_waiting_and_the_ended_ranks(ip):
    # rank 0 leaves the loop early and goes on with other work (it stays alive): the others
    # wait for it in an allreduce forever
    cell = ("import time, torch, horovod.torch as hvd\nhvd.init()\n"
            "steps = 2 if hvd.rank() == 0 else 5\n"
            "for step in range(steps):\n"
            "    hvd.allreduce(torch.ones(3), name=f'g{step}')\n"
            "if hvd.rank() == 0:\n"
            "    time.sleep(120)\n"
            "hvd.rank()\n")
    err, text = run_cell(ip, "--np -3 --stall-timeout 3 --on-stall fail", cell)
    # under its own name, said once (not as the view's notice and again as a RankError)
    assert isinstance(err, hvd_magic.RunStalled) and text.startswith("RunStalled: stall:"), text
    assert text.count("have been waiting") == 1, text
    assert "ranks 1, 2 have been waiting" in text
    assert "rank 0 is running elsewhere" in text
    run = hvd_magic.last_run()
    assert run.stall is not None
    # the report says where each rank is: the waiting ones in the cell's allreduce, grouped
    assert "ranks 1-2: Cell In[" in text and "→ allreduce" in text, text
    assert "rank 0: Cell In[" in text, text
    with open(os.path.join(run.run_dir, "stacks.txt")) as f:  # kept with the run
        assert "--- rank 1 ---" in f.read()
    assert rank_processes_left(run) == []


def test_rendezvous_failure_is_explained(ip):
    """Rank 1 never calls hvd.init(): rank 0's Gloo rendezvous times out and Horovod aborts."""
    cell = ("import time, horovod.torch as hvd\n"
            "import os\n"
            "if os.environ['HOROVOD_RANK'] == '0':\n"
            "    hvd.init()\n"
            "else:\n"
            "    time.sleep(60)\n")
    err, text = run_cell(ip, "--np -2 --env HOROVOD_GLOO_TIMEOUT_SECONDS=3", cell)
    assert err.rank == 0
    assert "SIGABRT" in text
    assert "rendezvous" in text and "hvd.init()" in text and "127.0.0.1:" in text


def test_np_above_the_slots_of_a_cluster_is_refused_at_once(ip, standalone):
    """spark.cores.max bounds what the session can ever get: refused from the setting, before
    any executor is waited for."""
    from IPython.core.error import UsageError
    session = standalone.session(wait=False, **{"spark.cores.max": "3"})  # 1 2-core executor
    runs_before = len(hvd_magic.runs())
    try:
        with pytest.raises(UsageError) as info:
            ip.run_cell_magic("horovod", "--np 4", "1")
        text = str(info.value)
        assert "np=4" in text and "at most 2 task slots" in text and "spark.cores.max=3" in text
        assert "--np 2" in text
        # refused before a run started: no barrier stage waited for slots it could never have
        assert len(hvd_magic.runs()) == runs_before
    finally:
        session.stop()


def test_np_above_the_registered_slots_says_what_the_cluster_has(standalone):
    """No setting bounds the session: the executors that registered are what it has, once the
    session has been up for the launcher's wait."""
    from IPython.core.error import UsageError

    from hvd_magic.launch.spark import SparkLauncher, cluster_slots
    session = standalone.session()  # (both executors registered)
    try:
        assert cluster_slots(session.sparkContext) == 4
        with pytest.raises(UsageError) as info:
            SparkLauncher(session, slot_wait=0).prepare(6)
        text = str(info.value)
        assert "np=6" in text and "4 task slots" in text and "2 executors" in text
        assert "--np 4" in text
    finally:
        session.stop()


def test_a_dead_spark_task_fails_the_run_once_without_retraining(ip, standalone):
    """Rank 1 kills its own Spark task while spark.task.maxFailures=4. Spark never re-attempts
    a failed barrier *result* stage (ours is one), so the run must fail once, clearly, with no
    second start of any rank; the driver also refuses a second start of a rank (a re-attempt)
    unless --retries is given."""
    session = standalone.session(**{"spark.task.maxFailures": "4"})
    try:
        cell = ("import os, signal, time\nimport horovod.torch as hvd\nhvd.init()\n"
                "if hvd.rank() == 1:  # its task: a forked rank's parent is the template\n"
                "    os.kill(int(os.environ.get('HVD_MAGIC_TASK_PID') or os.getppid()), 9)\n"
                "time.sleep(60)\n")
        with pytest.raises(hvd_magic.LaunchError) as info:
            ip.run_cell_magic("horovod", "--np 2 --quiet", cell)
        text = str(info.value)
        assert "rank 1" in text and "died" in text and "not started over" in text
        assert "Traceback" not in text and "at org.apache" not in text
        run = hvd_magic.last_run()
        assert run.retry is None  # no rank was started a second time
        assert rank_processes_left(run) == []
    finally:
        session.stop()


def test_dynamic_allocation_is_refused_with_advice(ip, standalone):
    from IPython.core.error import UsageError
    session = standalone.session(wait=False, **{
        "spark.dynamicAllocation.enabled": "true",
        "spark.dynamicAllocation.shuffleTracking.enabled": "true"})
    try:
        with pytest.raises(UsageError) as info:
            ip.run_cell_magic("horovod", "--np 2", "1")
        assert "dynamic allocation" in str(info.value)
        assert "spark.dynamicAllocation.enabled=false" in str(info.value)
    finally:
        session.stop()


class _ViewWithABug(TextView):
    """A view that raises on a rank's progress: a bug on the driver's side, not a rank's."""

    def event(self, run, rank, event):
        if event.get("t") == "progress":
            raise RuntimeError("a bug in the view")
        super().event(run, rank, event)


def test_a_bug_in_the_driver_loop_fails_the_run_and_stops_every_rank():
    def reports_then_sleeps():
        import time
        import horovod.torch as hvd
        import hvd_magic
        hvd.init()
        hvd_magic.report(step=0, total=1)
        time.sleep(600)

    run = hvd_magic.run(reports_then_sleeps, np=-2, background=True,
                        view=_ViewWithABug(quiet=True))
    with pytest.raises(hvd_magic.InternalError) as caught:
        run.wait(timeout=60)  # (without the fix: still "running" after 600 s)
    message = str(caught.value)
    assert "while applying rank " in message and "'progress' event" in message
    assert "RuntimeError: a bug in the view" in message and run.run_dir in message
    assert run.state == "failed" and run.error is caught.value
    assert rank_processes_left(run) == [] and our_children() == []
    with open(os.path.join(run.run_dir, "events.jsonl")) as f:
        assert '"t": "internal"' in f.read()  # its traceback, where the message says


def test_a_task_that_fails_before_its_rank_starts_ends_the_run(monkeypatch):
    """Task 0 cannot start its rank (here: no process could be made); rank 1, already waiting in
    its rendezvous for rank 0, is stopped at once and the run ends with task 0's error, rather
    than rank 1 waiting for a peer that never comes. (Seen: a cell hung for 10 minutes.)"""
    from hvd_magic.task import runner

    real = runner.start_rank

    def start_rank(settings, argv, *args, **kwargs):
        if "-rank0-" in argv[1]:  # the rank's work folder: hvd_magic-RUN-rank0-...
            raise OSError(11, "Resource temporarily unavailable (a fork failed)")
        return real(settings, argv, *args, **kwargs)

    monkeypatch.setattr(runner, "start_rank", start_rank)

    def waits_for_rank_0():
        import torch.distributed as dist
        dist.init_process_group("gloo")

    with pytest.raises(OSError, match="a fork failed"):  # not RunTimeout: no wait for rank 0
        hvd_magic.run(waits_for_rank_0, np=-2, view=TextView(quiet=True), timeout=300)
    run = hvd_magic.last_run()
    assert run.state == "failed" and run.ranks[1].state == "stopped"
    assert rank_processes_left(run) == []


def test_a_mistyped_name_keeps_pythons_own_hint(ip):
    """Python 3.10-3.11 add ". Did you mean: 'scale'?" only in the interpreter's own hook; a
    rank's traceback is text made by `traceback`, which left it out (#66)."""
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("distributed", "--np -2 --quiet", "scale = 2\nscael * 3\n")
    text = "\n".join(info.value._render_traceback_())
    assert "NameError: name 'scael' is not defined. Did you mean: 'scale'?" in text
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("distributed", "--np -2 --quiet", "'text'.uper()\n")
    assert "Did you mean: 'upper'?" in str(info.value)


def test_a_ranks_error_that_only_says_its_store_went_away_is_not_the_cause():
    """torch's TCPStore client whose server (rank 0's, gone with its Spark task) closed: the
    words of a bystander, as a reset connection is (found by bench/chaos.py: the run named
    rank 1's DistNetworkError as the cause of rank 0's killed task)."""
    from hvd_magic.errors import is_follow_on
    said = ("Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server "
            "shutdown or crash?")
    assert is_follow_on({"type": "DistNetworkError", "message": said})
    assert not is_follow_on({"type": "DistNetworkError", "message": "The client socket has "
                             "timed out after 600000ms while trying to connect to (10.0.0.1, 29500)."})


def test_lightnings_own_sigterm_exception_is_the_stops_not_a_cause():
    """Lightning's SIGTERM handler turns the stop's signal into SIGTERMException: a cancelled
    Lightning run is cancelled, not failed (found by bench/chaos.py: an interrupt in a fit read
    as rank 2's RankError)."""
    from hvd_magic.errors import is_follow_on
    assert is_follow_on({"type": "SIGTERMException", "message": ""})


def _ended_run(ranks, failures, stop_reason, where="spark", launcher_error=None, log_tail="",
               **more):
    """What `ending.run_error` reads of a run that ended: its ranks and failures, the stop's
    reason, the launcher's error and each rank's last lines."""
    return types.SimpleNamespace(
        id="r", np=len(ranks), ranks=ranks, failures=failures, elastic=None, retry=None,
        stop_reason=stop_reason, where=where,
        launcher=types.SimpleNamespace(error=launcher_error, outcomes=[],
                                       error_loses_ranks=launcher_error is not None),
        folder=types.SimpleNamespace(log_tail=lambda rank: log_tail), **more)


@pytest.mark.parametrize("after_stop", [True, False], ids=["after-the-cancel", "before-it"])
def test_a_horovod_abort_once_a_cancel_began_is_the_cancels_doing(after_stop):
    """A cancel that stops task 0 first takes Horovod's rendezvous with it: a rank still in
    hvd.init() aborts ("HTTP request failed", SIGABRT; the soak's seed 9, round 33). Once the
    stop has begun that abort is the stop's; before it, it is the rank's own failure."""
    from hvd_magic.driver.ending import run_error
    from hvd_magic.driver.ranks import RankState

    abort = {"rank": 2, "status": "died", "signal": "SIGABRT", "after_stop": after_stop,
             "traceback": "terminate called after throwing an instance of "
                          "'std::runtime_error'\n  what():  HTTP request failed."}
    ranks = [RankState(k) for k in range(3)]
    for r in ranks:
        r.state = "cancelled"
    error = run_error(_ended_run(ranks, [abort], "cancelled"), {2: abort}, None)
    if after_stop:
        assert isinstance(error, hvd_magic.RunCancelled), error
    else:
        assert isinstance(error, hvd_magic.RankError) and "rank 2" in str(error), error


def test_a_task_lost_to_the_stop_a_ranks_abort_made_is_not_named_as_the_cause():
    """Rank 2 aborted, its host cut off from Horovod's rendezvous (in task 0); the stop that
    followed cancelled the Spark job before rank 1's end was heard, and its task went with the
    job (soak seed 10, round 132): the abort is the cause, not rank 1's lost task. A task
    lost while nothing was stopping (Spark's own error) stays the cause of its ranks' aborts."""
    from hvd_magic.driver.ending import run_error
    from hvd_magic.driver.ranks import RankState
    from hvd_magic.errors import LaunchError

    abort = {"rank": 2, "status": "died", "signal": "SIGABRT", "after_stop": False,
             "traceback": "terminate called after throwing an instance of "
                          "'std::runtime_error'\n  what():  HTTP request failed."}
    ranks = [RankState(k) for k in range(3)]
    for k, r in enumerate(ranks):
        r.state, r.partition, r.host, r.executor = "stopped", k, "vm", "10.0.0.2:1"
    ranks[1].state = "running"  # (its end never heard)

    def error_when(spark_said):
        run = _ended_run(ranks, [abort], "failed", launcher_error=spark_said,
                         unended=lambda: [ranks[1]])
        return run_error(run, {2: abort}, None)

    ours = error_when(RuntimeError("Job 5 cancelled part of cancelled job group hvd_magic-r"))
    assert isinstance(ours, hvd_magic.RankError) and "rank 2" in str(ours), ours
    sparks = error_when(LaunchError("Job aborted due to stage failure: ResultTask(5, 1) lost"))
    assert isinstance(sparks, LaunchError) and "rank 1" in str(sparks), sparks


@pytest.mark.parametrize("killed_first", [True, False], ids=["kill-heard-first",
                                                               "error-heard-first"])
def test_a_sigkilled_rank_is_the_cause_beside_a_peers_error_whichever_came_first(killed_first):
    """Rank 1 SIGKILLed, rank 0's DeepSpeed step then raising a TypeError on gradients its peer
    never reduced (a fresh clone's tests/test_deepspeed.py, where the error was heard first): no
    peer's error sends a SIGKILL, so the killed rank is named either way."""
    from hvd_magic.driver.ending import run_error
    from hvd_magic.driver.ranks import RankState

    killed = {"rank": 1, "status": "died", "signal": "SIGKILL", "after_stop": False}
    raised = {"rank": 0, "status": "error", "type": "TypeError", "after_stop": False,
              "message": "'NoneType' object is not iterable",
              "traceback": "TypeError: 'NoneType' object is not iterable"}
    ranks = [RankState(k) for k in range(2)]
    failures = [killed, raised] if killed_first else [raised, killed]
    error = run_error(_ended_run(ranks, failures, "failed", where="driver only"),
                      {0: raised, 1: killed}, None)
    assert isinstance(error, hvd_magic.RankError) and error.rank == 1, error


# A rank's last words when TensorFlow's profiler crashed it as it stopped (a fresh clone's run:
# tests/test_timeline_ranks.py's TensorFlow cell, about once in 25).
PROFILER_CRASH = """Fatal Python error: Segmentation fault

Thread 0x00007f91461fe6c0 (most recent call first):
  File "/x/hvd_magic/rank/stall.py", line 81 in _monitor

Current thread 0x00007f917000fb80 (most recent call first):
  File "/x/site-packages/tensorflow/python/profiler/profiler_v2.py", line 149 in stop
  File "/x/hvd_magic/rank/tf_profile.py", line 67 in stop
  File "<hvd_magic cell 1>", line 21 in <module>
"""


@pytest.mark.parametrize("where", ["profiler", "elsewhere"])
def test_a_worker_crashed_by_tensorflows_profiler_is_told_so(where):
    from hvd_magic.driver.ending import run_error
    from hvd_magic.driver.ranks import RankState

    tail = PROFILER_CRASH if where == "profiler" else PROFILER_CRASH.replace(
        "tensorflow/python/profiler/profiler_v2.py", "mylib/native.py")
    crash = {"rank": 1, "status": "died", "signal": "SIGSEGV"}
    ranks = [RankState(k) for k in range(2)]
    run = _ended_run(ranks, [crash], "failed", where="driver only", log_tail=tail)
    error = run_error(run, {1: crash}, None)
    assert isinstance(error, hvd_magic.RankError) and "rank 1" in str(error), error
    told = "TensorFlow's profiler crashed rank 1 as it stopped (--timeline)" in \
        "\n".join(error._render_traceback_())
    assert told == (where == "profiler")


def test_an_idle_rank_is_left_to_the_collective_report_while_a_peer_waits_on_it():
    """A rank missing from hvd.init() (or a collective) sleeps at 0% CPU too: while a peer waits
    for it, the peer's report names it, with more to say; alone, it is an idle stall."""
    from hvd_magic.driver.ranks import RankState
    from hvd_magic.driver.watchdog import idle_message, stall_message

    ranks = [RankState(0), RankState(1)]
    for r in ranks:
        r.state, r.pid = "running", 1
    ranks[1].usage.add({"t": "resources", "time": 1.0, "cpu": 0.0, "cores": 2, "rss": 1 << 20})
    later = ranks[1].usage.idle_since + 5
    assert "rank 1 has used no CPU for 5 s" in idle_message(ranks, 3, later)
    ranks[0].blocked_since, ranks[0].blocked_op = later - 4, "init"
    assert idle_message(ranks, 3, later) is None
    assert "which has not called it" in stall_message(ranks, 3, later + 6)
    ranks[1].usage.add({"t": "resources", "time": 2.0, "cpu": 40.0, "cores": 2, "rss": 1 << 20})
    assert ranks[1].usage.idle_since is None  # a rank that works is not idle
