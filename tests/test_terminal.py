"""The terminal command, run as a real subprocess: ``python -m hvd_magic --np N script.py args``."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from IPython.core.error import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRAIN = """\
import argparse, os, sys
import torch, horovod.torch as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--exit-rank", type=int, default=-1)
parser.add_argument("--out", default="total.txt")
args = parser.parse_args()
hvd.init()
total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
if hvd.rank() == args.exit_rank:
    sys.exit(5)
if hvd.rank() == 0:
    with open(args.out, "w") as f:
        f.write(str(total))
"""

FOREVER = """\
import os, time
print("ready", os.getpid(), flush=True)
while True:
    time.sleep(1)
"""


def command(*args, **kwargs):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "hvd_magic", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_exit_codes_output_and_help(tmp_path):
    (tmp_path / "train.py").write_text(TRAIN)
    ok = command("-np", "-2", "train.py", "--out", "sum.txt")
    out, err = ok.communicate(timeout=300)
    assert ok.returncode == 0, err
    assert (tmp_path / "sum.txt").read_text() == "3.0"
    assert "hvd_magic run" in out and "done" in out and "rank 1 on" in out

    failed = command("--np", "-2", "--name", "exits", "train.py", "--exit-rank", "1")
    out, err = failed.communicate(timeout=300)
    assert failed.returncode == 5  # the script's own sys.exit code
    assert "train.py exited with code 5" in err
    assert f'{tmp_path}/train.py", line 11, in <module>' in err

    usage = command("--help")
    out, _ = usage.communicate(timeout=60)
    assert usage.returncode == 0
    assert "-np NP" in out and "--master URL" in out and "exit code" in out
    missing = command("-np", "-2", "nowhere.py")
    _, err = missing.communicate(timeout=60)
    assert missing.returncode == 2 and "No script 'nowhere.py'" in err


BYSTANDER = """\
import time, torch, horovod.torch as hvd
hvd.init()
for step in range(600):
    if hvd.rank() == 1 and step == 5:
        raise ValueError("bad batch")
    hvd.allreduce(torch.ones(1))
    time.sleep(0.05)
"""


def test_a_bystander_is_stopped_as_in_the_notebook(tmp_path):
    """Rank 1 fails; rank 0 only failed (or was stopped) because of it: "stopped", the word the
    notebook uses, in the summary and the error's list of the other ranks; never "failed"."""
    (tmp_path / "bystander.py").write_text(BYSTANDER)
    proc = command("-np", "-2", "bystander.py")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "ValueError: bad batch" in err
    assert re.search(r"^  rank 0( on \S+)?: stopped", out, re.M), out
    assert re.search(r"^  rank 1( on \S+)?: failed", out, re.M), out
    assert "rank 0: stopped" in err, err
    assert not re.search(r"rank 0( on \S+)?: failed", out + err)


def _lines(stream, into):
    for line in stream:
        into.put(line)


def test_ctrl_c_ends_every_rank_on_spark(tmp_path):
    (tmp_path / "forever.py").write_text(FOREVER)
    proc = command("-np", "2", "forever.py", start_new_session=True)
    lines = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    pids, deadline = {}, time.monotonic() + 240
    try:
        while len(pids) < 2 and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                continue
            if "] ready " in line:  # "[rank k] ready PID"
                rank = line.split("]")[0].removeprefix("[rank ")
                pids[rank] = int(line.split()[-1])
        assert len(pids) == 2, "the ranks did not start"
        assert all(psutil.pid_exists(pid) for pid in pids.values())
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "cancelled" in proc.stderr.read()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids.values()):
        time.sleep(0.1)
    assert not [pid for pid in pids.values() if _alive(pid)]
    # nothing else the command started stays either (the embedded Spark JVM ends with it)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _in_session(proc.pid):
        time.sleep(0.2)
    assert _in_session(proc.pid) == []


def _in_session(sid):
    found = []
    for p in psutil.process_iter(["pid", "name"]):
        try:
            if os.getsid(p.info["pid"]) == sid and _alive(p.info["pid"]):
                found.append(p.info["name"])
        except (ProcessLookupError, PermissionError):
            pass
    return found


def _alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_console_script_is_the_same_command():
    import importlib
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        target = tomllib.load(f)["project"]["scripts"]["hvd-run"]
    module, _, name = target.partition(":")
    from hvd_magic.frontends import terminal
    assert getattr(importlib.import_module(module), name) is terminal.run


# A horovodrun elastic script: rank 1 SIGKILLs itself once (a marker file says it did), after
# a commit; the others go on from the commit, and rank 0 writes the steps and the ring's size.
ELASTIC = """\
import os, signal, sys, time
import torch, horovod.torch as hvd

marker, out = sys.argv[1], sys.argv[2]
hvd.init()
model = torch.nn.Linear(2, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, optimizer, step=0)

@hvd.elastic.run
def train(state):
    while state.step < 30:
        optimizer.zero_grad()
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
        state.step += 1
        if state.step % 5 == 0:
            state.commit()
        if state.step == 12 and hvd.rank() == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.05)

train(state)
if hvd.rank() == 0:
    with open(out, "w") as f:
        f.write(str(state.step))
"""


def test_elastic_options_as_the_magic_has_them(ip, tmp_path):
    (tmp_path / "elastic.py").write_text(ELASTIC)
    run = command("-np", "-2", "--min-np", "1", "--max-np", "2", "--elastic-timeout", "60",
                  "elastic.py", "killed", "steps.txt")
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, out + err
    assert (tmp_path / "killed").exists()  # rank 1 was really killed...
    assert (tmp_path / "steps.txt").read_text() == "30"  # ...and the run went on to the end
    assert "membership:" in out and "lost" in out

    usage = command("--help")
    help_text, _ = usage.communicate(timeout=60)
    for flag in ("--min-np M", "--max-np N", "--elastic-timeout S"):
        assert flag in help_text
    # a bad combination: the magic's own message, exit code 2
    for line in ("-np -2 --max-np 3", "-np -3 --min-np 4", "-np -2 --min-np 0",
                 "-np -2 --min-np 1 --elastic-timeout -5"):
        bad = command(*line.split(), "elastic.py", "m", "o")
        _, err = bad.communicate(timeout=60)
        with pytest.raises(UsageError) as magic:
            ip.run_line_magic("horovod", f"{line.replace('-np', '--np', 1)} --text elastic.py m o")
        assert bad.returncode == 2 and f"error: {magic.value}" in err, (line, err)
