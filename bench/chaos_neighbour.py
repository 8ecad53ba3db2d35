"""A second notebook beside a round of bench/chaos.py: an IPython shell in a process of its own
that runs its own cell on the driver (``--np -2``, a DDP loop) the whole round long, and, drawn
from the round's seed, cancels its own run at a moment of its own. Whatever the round's fault
does (a kill, a cancel, a timeout, the round's end and its leak sweep), the neighbour's ranks
must stay alive and its run go on to its own end: "neighbour touched" where they did not."""

import atexit
import json
import os
import queue
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from chaos_leaks import LEAK_WAIT, _alive

SCRIPT = """\
import json, os, sys, time
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "hvd_magic")
for line in sys.stdin:  # (a round's cell each: the shell lives on from round to round)
    spec = json.loads(line)
    ip.user_ns.update(stop=spec["stop"], cancel_at=spec["cancel_at"])
    run = ip.run_cell_magic("distributed", "--np -2 --background --quiet", '''
import os, time, torch, torch.distributed as dist
import hvd_magic
dist.init_process_group("gloo")
step = 0
while not os.path.exists(stop) and step < 3000:
    dist.all_reduce(torch.ones(4))
    step += 1
    hvd_magic.report(step=step)
    time.sleep(0.05)
step
''')
    said = False
    while run.state == "running":
        pids = [r.pid for r in run.ranks]
        if not said and all(pids):
            print("CHAOS", json.dumps({"run": run.id, "pids": pids}), flush=True)
            said = True
        if spec["cancel_at"] and min(r.step or 0 for r in run.ranks) >= spec["cancel_at"]:
            run.cancel()
        time.sleep(0.05)
    try:
        run.wait()
        error = None
    except Exception as exc:
        error = f"{type(exc).__name__}: {str(exc)[:300]}"
    print("CHAOS", json.dumps({"state": run.state, "error": error, "results": run.results}),
          flush=True)
"""


class _Shell:
    """The second notebook's process, started at the first round beside it and kept for the
    next (its IPython, hvd_magic and its ranks' template made once: a few seconds of every
    such round); started again where it ended. Its lines are read by a thread of its own."""

    def __init__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-c", SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
            # (its cells run on the driver: no Spark session begun in the background, whose
            # JVM only took the cores of the round beside it)
            env=dict(os.environ, HVD_MAGIC_PRESTART="0"))
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        atexit.register(self.close)

    def _read(self):
        for line in self.process.stdout:
            if line.startswith("CHAOS "):
                self.lines.put(json.loads(line[len("CHAOS "):]))
        self.lines.put(None)  # (it ended)

    def said(self, limit):
        """Its next word (a dict), or None where it ended or said nothing within `limit` s."""
        try:
            return self.lines.get(timeout=max(0.0, limit))
        except queue.Empty:
            return None

    def close(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


_shell = None


def _the_shell():
    global _shell
    if _shell is None or _shell.process.poll() is not None:
        _shell = _Shell()
    return _shell


class Neighbour:
    """The second notebook of a round, started before the round's run."""

    def __init__(self, seed, number, cancel_at=None):
        """(`cancel_at`: the step at which it cancels its own run, 0: never; drawn from the
        round where not given. It is told at once: set later, its shell would not hear it.)"""
        rng = random.Random(f"{seed}:{number}:neighbour")
        drawn = rng.choice([0, rng.randint(5, 60)])  # 0: it runs to its stop
        self.cancel_at = drawn if cancel_at is None else cancel_at
        self.folder = tempfile.mkdtemp(prefix="chaos-neighbour-")
        self.stop = os.path.join(self.folder, "stop")
        self.shell = _the_shell()
        self.process = self.shell.process
        self.process.stdin.write(json.dumps({"stop": self.stop, "cancel_at": self.cancel_at})
                                 + "\n")
        self.process.stdin.flush()
        self.started = None

    def wait_started(self, limit=120.0):
        """Until its ranks run (its pids said); False where it never got there."""
        self.started = self.shell.said(limit)
        return "pids" in (self.started or {})

    def finish(self):
        """After the round (its fault, its end, its leak sweep): the problems of the neighbour.
        Its ranks must be alive still (unless it cancelled itself), then it is told to stop and
        its run must end as its own doing says: done with every rank's result, or cancelled."""
        problems = []
        pids = (self.started or {}).get("pids") or []
        if not pids:
            problems.append("neighbour touched: its ranks never started")
        dead = [p for p in pids if not _alive(p)]
        if dead and not self.cancel_at:
            problems.append(f"neighbour touched: its rank processes {dead} ended during the "
                            f"round")
        open(self.stop, "w").close()
        end = self.shell.said(90) if pids else self.started  # (no pids: it said its end)
        if end is None:  # (what it says later is not the next round's: started again then)
            self.shell.close()
            problems.append("neighbour touched: its notebook never said how its run ended")
        elif end["state"] == "cancelled" and self.cancel_at:
            pass
        elif end["state"] != "done" or len(end["results"] or []) != 2:
            problems.append(f"neighbour touched: its run ended {end['state']} ({end['error']})")
        gone_by = time.monotonic() + LEAK_WAIT  # (as long as the round's own ranks have)
        while any(_alive(p) for p in pids) and time.monotonic() < gone_by:
            time.sleep(0.1)
        for pid in pids:  # (its own: started by this harness, ended by pid)
            if _alive(pid):
                problems.append(f"neighbour touched: its rank {pid} outlived its run")
                os.kill(pid, 9)
        shutil.rmtree(self.folder, ignore_errors=True)
        return problems
