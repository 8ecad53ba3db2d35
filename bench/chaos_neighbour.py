"""A second notebook beside a round of bench/chaos.py: an IPython shell in a process of its own
that runs its own cell on the driver (``--np -2``, a DDP loop) the whole round long, and, drawn
from the round's seed, cancels its own run at a moment of its own. Whatever the round's fault
does (a kill, a cancel, a timeout, the round's end and its leak sweep), the neighbour's ranks
must stay alive and its run go on to its own end: "neighbour touched" where they did not."""

import json
import os
import random
import subprocess
import sys
import tempfile
import time

from chaos_leaks import _alive

SCRIPT = """\
import json, os, sys, time
from IPython.testing.globalipapp import start_ipython
spec = json.loads(sys.argv[1])
ip = start_ipython()
ip.run_line_magic("load_ext", "hvd_magic")
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


class Neighbour:
    """The second notebook of a round, started before the round's run."""

    def __init__(self, seed, number):
        rng = random.Random(f"{seed}:{number}:neighbour")
        self.cancel_at = rng.choice([0, rng.randint(5, 60)])  # 0: it runs to its stop
        self.folder = tempfile.mkdtemp(prefix="chaos-neighbour-")
        self.stop = os.path.join(self.folder, "stop")
        self.process = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, json.dumps({"stop": self.stop,
                                                       "cancel_at": self.cancel_at})],
            stdout=subprocess.PIPE, text=True)
        self.started = None

    def wait_started(self, limit=120.0):
        """Until its ranks run (its pids said); False where it never got there."""
        gone_by = time.monotonic() + limit
        for line in self.process.stdout:
            if line.startswith("CHAOS "):
                self.started = json.loads(line[len("CHAOS "):])
                return "pids" in self.started
            if time.monotonic() > gone_by:
                break
        return False

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
        end = None
        try:
            out, _ = self.process.communicate(timeout=90)
            for line in out.splitlines():
                if line.startswith("CHAOS "):
                    end = json.loads(line[len("CHAOS "):])
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if end is None:
            problems.append("neighbour touched: its notebook never said how its run ended")
        elif end["state"] == "cancelled" and self.cancel_at:
            pass
        elif end["state"] != "done" or len(end["results"] or []) != 2:
            problems.append(f"neighbour touched: its run ended {end['state']} ({end['error']})")
        for pid in pids:  # (its own: started by this harness, ended by pid)
            if _alive(pid):
                problems.append(f"neighbour touched: its rank {pid} outlived its notebook")
                os.kill(pid, 9)
        import shutil
        shutil.rmtree(self.folder, ignore_errors=True)
        return problems
