"""Ranks forked from the host's template (`hvd_magic.template`): each a rank of its own
(environment, folder, threads, session, no state from the cell before), results, failures,
timeouts and cancels as with fresh ranks, ``--fresh`` the old way, and the template gone with
its owner. Real ranks, real Horovod, real processes really killed."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

import hvd_magic
from hvd_magic.template import client, wanted

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def _forked_by_default(monkeypatch):
    """The magic's cells fork here whatever the default is (HVD_MAGIC_FRESH=1 runs elsewhere)."""
    monkeypatch.setenv("HVD_MAGIC_FRESH", "0")


def make_who():
    """A rank's view of itself (nested: pickled by value, as a cell's function is)."""
    def who():
        import os
        import sys
        import torch
        import horovod.torch as hvd
        hvd.init()
        total = hvd.allreduce(torch.ones(1), op=hvd.Sum).item()
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode()
        return {"total": total, "pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(),
                "own_session": os.getsid(0) == os.getpid(), "threads": torch.get_num_threads(),
                "omp": os.environ.get("OMP_NUM_THREADS"), "mark": os.environ.get("MARK"),
                "cmdline": cmdline, "torch_before": "torch" in sys.modules["__main__"].MODULES_BEFORE_CALL}
    return who


def gone(pid, within=20):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_what_a_template_holds_comes_from_the_jobs_imports():
    assert wanted({"imports": ["horovod.torch", "os"]}) == ["numpy", "torch", "horovod.torch"]
    assert wanted({"imports": ["pandas"]}) == ["numpy", "pandas"]
    assert wanted({"imports": ["tensorflow", "horovod.tensorflow", "json"]}) == []
    script = "import sys\nfrom horovod.torch import allreduce\n"
    assert wanted({"sources": {"train.py": script}}) == ["numpy", "torch", "horovod.torch"]


def test_a_source_that_cannot_be_parsed_now_leaves_the_captured_imports(monkeypatch):
    """CPython 3.11's parser can fail with a SystemError when another thread parses at the same
    time (python/cpython#106905: a fresh clone's run hit it in a task thread). The task then
    goes on with what the capture found, rather than failing before its rank starts."""
    import ast

    def parse(source, *args, **kwargs):
        raise SystemError("AST constructor recursion depth mismatch (before=30, after=26)")

    monkeypatch.setattr(ast, "parse", parse)
    job = {"imports": ["torch"], "sources": {"cell": "import horovod.torch\n"}}
    assert wanted(job) == ["numpy", "torch"]


def test_sources_parsed_in_several_threads_at_once_keep_their_imports():
    """The tasks of a --np -N run are threads of the notebook, each reading its job's imports
    (`wanted`) at once. Here a thread switch comes in the middle of every parse's building of
    its tree, as a garbage collection's callback or finalizer in Python code makes one: no
    parse may fail for another's (python/cpython#106905, above)."""
    import gc
    import threading

    body = "".join(f"def f{i}(x):\n    return [(a, {{b: c}}) for a in x for b in a]\n"
                   for i in range(50))
    job = {"sources": {"cell": "import torch\n" + body}}
    found = []

    def task():
        for _ in range(20):
            found.append(wanted(job))

    def switch(phase, info):
        time.sleep(0.001)  # (releases the GIL: another thread runs, maybe in its parse)

    threads = [threading.Thread(target=task) for _ in range(4)]
    gc.callbacks.append(switch)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.callbacks.remove(switch)
    assert found == [["numpy", "torch"]] * 80


def test_a_forked_rank_has_its_own_environment_folder_threads_and_session(tmp_path):
    runs = [hvd_magic.run(make_who(), np=-2, view=None, env={"MARK": str(i)}, fresh=False).results
            for i in range(2)]
    template = client.status()
    assert template is not None and "horovod.torch" in template["modules"]
    assert template["rss"] > 0 and template["pss"] > 0
    for i, results in enumerate(runs):
        for rank in results:
            assert rank["total"] == 2.0
            assert rank["ppid"] == template["pid"]      # forked from the template
            assert rank["torch_before"]                 # which had imported torch
            assert rank["mark"] == str(i)               # the run's own environment
            assert rank["cwd"] == str(tmp_path)         # the notebook's folder
            assert rank["own_session"]
            assert rank["threads"] == int(rank["omp"])  # its share, though torch was loaded
            assert "-m hvd_magic.rank" in rank["cmdline"]
    assert {r["pid"] for r in runs[0]}.isdisjoint(r["pid"] for r in runs[1])  # new each run
    # the template's room for a rank's command line shows as nothing in `ps` (1024 dots did)
    shown = " ".join(psutil.Process(template["pid"]).cmdline())
    assert "hvd_magic.template.server" in shown and "..." not in shown, shown


def test_fresh_starts_ranks_the_old_way():
    results = hvd_magic.run(make_who(), np=-1, view=None, fresh=True).results
    assert results[0]["ppid"] == os.getpid()  # the task (a thread of this process) started it
    assert not results[0]["torch_before"]


def test_something_else_at_the_templates_socket_path_means_a_fresh_rank(tmp_path):
    """Whatever stands at the socket's path (here a stream socket, where ours is a
    SOCK_SEQPACKET one: "Protocol wrong type"), the task gets no template, not an error."""
    import socket
    env = {"HVD_MAGIC_TEMPLATE_IDLE": "an env of this test's own"}  # its own socket path
    path = client.socket_path(env)
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        other.bind(path)
        other.listen()
        assert client.connect(env) is None
        assert client.fork_rank(["hvd_magic.rank", str(tmp_path)], env, str(tmp_path)) is None
    finally:
        other.close()
        os.unlink(path)


def test_no_state_passes_from_one_cell_to_the_next(ip):
    ip.run_cell_magic("horovod", "--np -2 --quiet",
                      "import numpy, torch\nnumpy.marked = 'by the first cell'\nnumpy.random.rand()")
    value = ip.run_cell_magic("horovod", "--np -2 --quiet",
                              "import numpy, os\n(getattr(numpy, 'marked', None), os.getppid())")
    assert value == (None, client.status()["pid"])


def test_forked_ranks_draw_their_own_random_numbers():
    def draw():
        import numpy, random
        return numpy.random.randint(1 << 30), random.getrandbits(30)

    first = hvd_magic.run(draw, np=-2, view=None, fresh=False).results
    second = hvd_magic.run(draw, np=-2, view=None, fresh=False).results
    assert len({*first, *second}) == 4


def test_a_failure_shows_the_ranks_own_traceback(ip):
    cell = "import torch\nx = 1\nraise ValueError(f'bad value {x}')\n"
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -2 --quiet", cell)
    text = "\n".join(info.value._render_traceback_())
    assert "ValueError: bad value 1" in text
    assert "raise ValueError(f'bad value {x}')" in text


def test_timeout_and_cancel_stop_forked_ranks(ip):
    cell = "import time, torch\nfor step in range(1000):\n    print(f'step {step}')\n    time.sleep(0.2)\n"
    with pytest.raises(hvd_magic.RunTimeout):
        ip.run_cell_magic("horovod", "--np -2 --quiet --timeout 3", cell)
    run = hvd_magic.last_run()
    assert all(gone(r.pid) for r in run.ranks)

    def sleepy():
        import time
        import torch  # noqa: F401
        time.sleep(600)

    run = hvd_magic.run(sleepy, np=-2, background=True, view=None, fresh=False)
    deadline = time.monotonic() + 60
    while not all(r.pid and r.state == "running" for r in run.ranks):
        assert time.monotonic() < deadline, [r.state for r in run.ranks]
        time.sleep(0.05)
    assert psutil.Process(run.ranks[0].pid).ppid() == client.status()["pid"]
    run.cancel()
    with pytest.raises(hvd_magic.RunCancelled):
        run.wait(timeout=30)
    assert all(gone(r.pid) for r in run.ranks)


OWNER = textwrap.dedent("""\
    import sys, time, hvd_magic
    from hvd_magic.template import client

    def sleepy():
        import os, time, torch
        print("rank", os.getpid(), flush=True)
        time.sleep(600)

    run = hvd_magic.run(sleepy, np=-2, background=True, view=None, fresh=False)
    while not all(r.pid and r.state == "running" for r in run.ranks):
        time.sleep(0.05)
    print("template", client.status()["pid"], client.socket_path(dict(__import__("os").environ)),
          flush=True)
    print("ranks", *[r.pid for r in run.ranks], flush=True)
    time.sleep(600)
    """)


def test_the_template_and_its_ranks_go_when_the_owner_is_killed(tmp_path):
    script = tmp_path / "owner.py"
    script.write_text(OWNER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE),
                                                        os.environ.get("PYTHONPATH", "")]))
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             env=env, cwd=tmp_path, start_new_session=True)
    try:
        seen = {}
        deadline = time.monotonic() + 120
        while "ranks" not in seen and time.monotonic() < deadline:
            line = owner.stdout.readline()
            if not line:
                break
            word, *rest = line.split()
            seen[word] = rest
        template, path = int(seen["template"][0]), seen["template"][1]
        ranks = [int(p) for p in seen["ranks"]]
        assert all(psutil.Process(p).ppid() == template for p in ranks)
        assert os.path.exists(path)
        os.killpg(owner.pid, signal.SIGKILL)  # the notebook's kernel, killed outright
        owner.wait()
        assert gone(template) and all(gone(p) for p in ranks)
        assert not os.path.exists(path)
    finally:
        if owner.poll() is None:
            os.killpg(owner.pid, signal.SIGKILL)
            owner.wait()


def test_an_idle_template_ends(tmp_path):
    env = dict(os.environ, HVD_MAGIC_TEMPLATE_IDLE="1")
    sock = client.connect(env)  # started for this environment (a key of its own)
    try:  # (a connection open is a request to come: the template is not idle meanwhile)
        status = client.status(env)
    finally:
        sock.close()
    assert status is not None and status["owner"] == os.getpid()
    assert gone(status["pid"], within=30)
    assert client.status(env) is None


def test_a_warm_session_starts_from_the_template_and_keeps_its_state(ip, fresh_ns):
    hvd_magic.run(make_who(), np=-1, view=None, fresh=False)  # the template holds torch now
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        ip.run_cell_magic("horovod", "--quiet", "import os, torch\nkept = torch.ones(2)")
        value = ip.run_cell_magic("horovod", "--quiet", "(float(kept.sum()), os.getppid())")
        assert value == (2.0, client.status()["pid"])
    finally:
        ip.run_line_magic("horovod_session", "stop")


def make_leaver():
    """A file in the temporary folder left as TensorFlow's autograph leaves one: removed only by
    an atexit hook, which a rank (skipping interpreter teardown) never runs."""
    def leave():
        import atexit
        import os
        import tempfile
        fd, path = tempfile.mkstemp(suffix=".py")
        os.close(fd)
        atexit.register(os.remove, path)
        return path
    return leave


@pytest.mark.parametrize("fresh", [False, True], ids=["forked", "fresh"])
def test_what_a_rank_leaves_in_its_temporary_folder_goes_with_it(tmp_path, fresh):
    paths = hvd_magic.run(make_leaver(), np=-2, view=None, fresh=fresh).results
    assert len(set(paths)) == 2
    for path in paths:
        assert not path.startswith(str(tmp_path))
        assert "hvd_magic-" in path  # in the rank's own folder
        assert not os.path.exists(path)
    # a TMPDIR given with the run is the user's: what is left there stays
    kept = hvd_magic.run(make_leaver(), np=-1, view=None, fresh=fresh,
                         env={"TMPDIR": str(tmp_path)}).value
    assert os.path.dirname(kept) == str(tmp_path) and os.path.exists(kept)
