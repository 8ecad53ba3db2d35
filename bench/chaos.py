"""Faults at random: rounds of runs, each with a fault at a random moment, and what every round
must show, checked here (not by eye).

A round is drawn from its seed: a launcher (``--np -3`` on the driver, ``--np 3`` on a local
Spark session), a program (a DDP loop; an elastic DDP loop written with `hvd_magic.elastic`), a
fault (a rank SIGKILLed; a rank frozen with SIGSTOP under ``--timeout``; the run cancelled; none)
and its moment (after a random step of a random rank, or as soon as the rank's process exists:
in its imports or in ``init_process_group``). What it must show:

- **ends**: the run ends within a deadline derived from its options (the timeout, the elastic
  run's recovery), or the round counts a hang;
- **names its cause**: killed → a `RankError` naming the rank and SIGKILL (an elastic run: no
  error, the survivors and the replacement end with equal weights); frozen → `RunTimeout`;
  cancelled → `RunCancelled`; none → done;
- **leaves nothing behind**: no process whose command line names the run is left 10 s after it
  ended (ranks, their children);
- **keeps every log**: the run folder has a log for every rank.

A failing round prints its seed: ``--seed S --only R`` replays it.

    .venv/bin/python bench/chaos.py [--rounds 40] [--seed 1] [--launchers driver spark]
                                    [--programs ddp elastic] [--faults kill freeze cancel none]
                                    [--json PATH]
    .venv/bin/python bench/chaos.py --table A.json B.json   # the figures of earlier rounds

The suite runs a short seeded slice (tests/test_chaos.py); the long soak stays here.
"""

import argparse
import collections
import json
import os
import random
import signal
import sys
import time

NP = 3
STEPS = 60
TIMEOUT = 20          # --timeout of a round whose rank is frozen (seconds)
LEAK_WAIT = 10.0      # seconds after the end for the run's processes to be gone

DDP = """\
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import hvd_magic
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(steps):
    optimizer.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    hvd_magic.report(step=step + 1, total=steps)
    time.sleep(0.03)
dist.get_rank()
"""

ELASTIC = """\
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import hvd_magic
from hvd_magic import elastic
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
state = elastic.TorchState(model=model, optimizer=optimizer, step=0)

@elastic.run
def train(state):
    ddp = DDP(state.model)
    while state.step < steps:
        optimizer.zero_grad()
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(state.step))
        ddp(x).sum().backward()
        optimizer.step()
        state.step += 1
        if state.step % 5 == 0:
            state.commit()
        hvd_magic.report(step=state.step, total=steps)
        time.sleep(0.03)

train(state)
torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
"""

PROGRAMS = {"ddp": DDP, "elastic": ELASTIC}
LAUNCHERS = {"driver": f"--np -{NP}", "spark": f"--np {NP}"}
FAULTS = ("kill", "freeze", "cancel", "none")


def draw(seed, number, launchers, programs, faults, timeout=TIMEOUT):
    """Round `number` of seed `seed`: what runs, what goes wrong, and when (`timeout`: the
    --timeout of a round whose rank is frozen)."""
    rng = random.Random(f"{seed}:{number}")
    program = rng.choice(programs)
    fault = rng.choice([f for f in faults if not (program == "elastic" and f == "freeze")])
    return {"seed": seed, "round": number, "launcher": rng.choice(launchers),
            "program": program, "fault": fault, "victim": rng.randrange(NP),
            "at_step": rng.choice([0, rng.randint(1, 25)]),  # 0: in its start (imports, init)
            "extra_delay": round(rng.uniform(0, 0.05), 3),
            "timeout": timeout}


def options(round_):
    line = f"{LAUNCHERS[round_['launcher']]} --background --quiet"
    if round_["program"] == "elastic":
        line += f" --min-np {NP - 1}"
    if round_["fault"] == "freeze":
        line += f" --timeout {round_['timeout']}"
    return line


def deadline(round_):
    """Seconds the round's run may take at most: its work, start-up, and what its fault adds."""
    base = 120.0 if round_["launcher"] == "spark" else 90.0
    if round_["program"] == "elastic":
        base += 60.0  # a replacement's start and the world formed again
    return base + (round_["timeout"] if round_["fault"] == "freeze" else 0)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _leftovers(run):
    """Pids of the run's processes still alive: every rank process it had (a forked rank's
    command line is its template's), and any process whose command line names the run (a
    fresh rank's folder)."""
    pids = {r.pid for r in run.ranks if r.pid} | {
        c["pid"] for c in (run.membership or []) if isinstance(c.get("pid"), int)}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if run.id.encode() in f.read():
                        pids.add(int(name))
            except OSError:
                pass
    return sorted(pid for pid in pids if _alive(pid))


def _at_step(run, rank, step, limit):
    """Wait until `rank` reported `step` (or the run ended, or `limit` passed)."""
    while run.state == "running" and time.monotonic() < limit:
        if (run.ranks[rank].step or 0) >= step and run.ranks[rank].pid:
            return True
        time.sleep(0.01)
    return False


def play(ip, round_):
    """Run one round; its outcome: the round with ``ok`` and, where not, ``problems``."""
    import hvd_magic

    if round_["launcher"] == "spark":
        hvd_magic.spark_session()
    ip.user_ns["steps"] = STEPS
    began = time.monotonic()
    limit = began + deadline(round_)
    run = ip.run_cell_magic("distributed", options(round_), PROGRAMS[round_["program"]])
    victim, fault = round_["victim"], round_["fault"]
    stopped_pid = None
    if fault != "none" and _at_step(run, victim, round_["at_step"], limit):
        time.sleep(round_["extra_delay"])
        pid = run.ranks[victim].pid
        try:
            if fault == "kill":
                os.kill(pid, signal.SIGKILL)
            elif fault == "freeze":
                os.kill(pid, signal.SIGSTOP)
                stopped_pid = pid
            elif fault == "cancel":
                run.cancel()
        except ProcessLookupError:
            pass
    error = None
    try:
        run.wait(max(1.0, limit - time.monotonic()))
    except Exception as exc:  # noqa: BLE001  (the run's error: checked below)
        error = exc
    took = time.monotonic() - began
    problems = []
    if run.state == "running":
        problems.append(f"hang: still running after {deadline(round_):.0f} s")
        run.cancel()
        try:
            run.wait(60)
        except Exception:  # noqa: BLE001
            pass
    problems += _misnamed(round_, run, error)
    if stopped_pid is not None:  # (a frozen rank the stop could not end is a leak below)
        try:
            os.kill(stopped_pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    gone_by = time.monotonic() + LEAK_WAIT
    left = _leftovers(run)
    while left and time.monotonic() < gone_by:
        time.sleep(0.2)
        left = _leftovers(run)
    if left:
        problems.append(f"leak: processes {left} outlived the run")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    logs = [k for k in range(NP) if not os.path.exists(run.folder.log_path(k))]
    if logs:
        problems.append(f"lost logs: no log of rank(s) {logs}")
    return dict(round_, run=run.id, seconds=round(took, 2), state=run.state,
                error=type(error).__name__ if error else None, ok=not problems,
                problems=problems)


def _misnamed(round_, run, error):
    """What is wrong with how the run ended, for its fault ([] if nothing)."""
    fault, elastic = round_["fault"], round_["program"] == "elastic"
    message = str(error) if error is not None else ""
    if run.state == "running":
        return []  # (a hang, said already)
    if fault == "none" or (fault == "kill" and elastic):
        if run.state != "done":
            return [f"lost run: {run.state} ({type(error).__name__}: {message[:300]})"]
        if elastic and len({json.dumps(r) for r in run.results}) != 1:
            return ["unequal weights after the elastic run"]
        return []
    expected = {"kill": "RankError", "freeze": "RunTimeout", "cancel": "RunCancelled"}[fault]
    if type(error).__name__ != expected:
        if run.state == "done" and fault in ("cancel", "kill"):
            return []  # the fault came after the last step (the run had ended)
        return [f"misnamed: {type(error).__name__} ({message[:300]}), not {expected}"]
    if fault == "kill" and not (f"rank {round_['victim']}" in message and "SIGKILL" in message):
        return [f"misnamed: the kill's error does not name rank {round_['victim']} and "
                f"SIGKILL: {message[:300]}"]
    return []


def rounds(ip, seed, count, launchers=tuple(LAUNCHERS), programs=tuple(PROGRAMS),
           faults=FAULTS, only=None, out=sys.stderr, timeout=TIMEOUT):
    """Play `count` rounds of `seed` (or round `only`); their outcomes."""
    outcomes = []
    for number in ([only] if only is not None else range(count)):
        round_ = draw(seed, number, list(launchers), list(programs), list(faults), timeout)
        outcome = play(ip, round_)
        outcomes.append(outcome)
        print(json.dumps(outcome), file=out, flush=True)
        if not outcome["ok"]:
            print(f"FAILED round: --seed {seed} --only {number}: {outcome['problems']}",
                  file=out, flush=True)
    return outcomes


def table(outcomes):
    """Markdown: rounds per fault and launcher, and the rounds that failed each check."""
    cells = collections.defaultdict(lambda: collections.Counter())
    for o in outcomes:
        c = cells[(o["fault"], o["launcher"], o["program"])]
        c["rounds"] += 1
        for problem in o["problems"]:
            c[problem.split(":")[0]] += 1
    kinds = ["hang", "misnamed", "lost run", "unequal weights after the elastic run", "leak",
             "lost logs"]
    lines = ["| fault | launcher | program | rounds | " + " | ".join(kinds) + " |",
             "|---|---|---|---:|" + "---:|" * len(kinds)]
    for (fault, launcher, program), c in sorted(cells.items()):
        lines.append(f"| {fault} | {launcher} | {program} | {c['rounds']} | "
                     + " | ".join(str(c[k]) for k in kinds) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", type=int, default=None, help="replay this round of the seed")
    parser.add_argument("--launchers", nargs="+", default=list(LAUNCHERS))
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS))
    parser.add_argument("--faults", nargs="+", default=list(FAULTS))
    parser.add_argument("--json")
    parser.add_argument("--table", nargs="+", metavar="JSON",
                        help="print the table of earlier rounds' --json files (no round run)")
    args = parser.parse_args()
    if args.table:
        outcomes = [o for path in args.table for o in json.load(open(path))]
        print(table(outcomes))
        print(f"{len(outcomes)} rounds, seeds {sorted({o['seed'] for o in outcomes})}, "
              f"{sum(o['seconds'] for o in outcomes) / 60:.0f} minutes of runs; "
              f"{sum(not o['ok'] for o in outcomes)} failed")
        return 0
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    began = time.monotonic()
    outcomes = rounds(ip, args.seed, args.rounds, args.launchers, args.programs, args.faults,
                      args.only)
    print(table(outcomes))
    failed = [o for o in outcomes if not o["ok"]]
    print(f"{len(outcomes)} rounds (seed {args.seed}) in {time.monotonic() - began:.0f} s; "
          f"{len(failed)} failed" + "".join(f"\n  --seed {o['seed']} --only {o['round']}: "
                                            f"{o['problems']}" for o in failed))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(outcomes, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
