"""The outputs of bench/chaos.py (a line of JSON a round, written compressed into
``bench/soak/*.jsonl.gz``) and the tables of RELIABILITY.md made from them. Only rounds whose
fault struck are counted in the checks (a round whose fault never happened is shown apart, as
unstruck, and counts as nothing); its problems, whatever they are, are still listed."""

import collections
import glob
import gzip
import json
import os
import re

from chaos_leaks import COLUMNS

SOAK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "soak")
CHECKS = ("hang", "misnamed", "lost run", "unequal weights after the elastic run",
          "unusable session", "lost logs", "slow", "neighbour touched")
BEGIN, END = "<!-- chaos --table: begin -->", "<!-- chaos --table: end -->"


def counted(outcome):
    """Whether a round counts: its fault struck ("none": nothing to strike, always counts)."""
    return outcome["fault"] == "none" or outcome.get("struck") is True


def write(path, outcome):
    """Append one round to compressed output `path` (a gzip member a line: readable whole
    however the soak ended)."""
    with gzip.open(path, "at") as f:
        f.write(json.dumps(outcome) + "\n")


def outcomes_in(path):
    """The rounds of an output: .jsonl.gz, a --json file, or what a run printed."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.startswith('{"seed"')]


def committed():
    return sorted(glob.glob(os.path.join(SOAK, "*.jsonl.gz")))


def _percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered) + 0.5) - 1))]


def _row(cells):
    return "| " + " | ".join(str(c) for c in cells) + " |"


def tables(outcomes):
    """Markdown: the checks of struck rounds per fault and launcher (unstruck apart), the leaks
    looked for (a column each), and the time from each fault to its error."""
    groups = collections.defaultdict(list)
    for o in outcomes:
        groups[(o["fault"], o["launcher"])].append(o)
    checks = [_row(["fault", "launcher", "rounds counted (struck; none)",
                    "unstruck (not counted)", "programs", *CHECKS]), "|---|---|---:|---:|---|" + "---:|" * len(CHECKS)]
    leaks = [_row(["fault", "launcher", "rounds counted", *(f"leak: {c}" for c in COLUMNS)]),
             "|---|---|---:|" + "---:|" * len(COLUMNS)]
    times = [_row(["fault", "launcher", "timed", "median s", "p99 s", "max s", "bound s",
                   "over the bound"]), "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (fault, launcher), rows in sorted(groups.items()):
        struck = [o for o in rows if counted(o)]
        kinds = collections.Counter(p.split(":")[0] for o in struck for p in o["problems"])
        ran = ", ".join(f"{p} {n}" for p, n in sorted(collections.Counter(
            o["program"] for o in struck).items()))
        checks.append(_row([fault, launcher, len(struck), len(rows) - len(struck), ran or "-",
                            *(kinds[k] for k in CHECKS)]))
        leaks.append(_row([fault, launcher, len(struck),
                           *(kinds[f"leak {c}"] for c in COLUMNS)]))
        timed = [o["to_error"] for o in struck if o.get("to_error") is not None]
        if timed:
            bounds = sorted({o["bound"] for o in struck if o.get("bound") is not None})
            times.append(_row([fault, launcher, len(timed), f"{_percentile(timed, 50):.1f}",
                               f"{_percentile(timed, 99):.1f}", f"{max(timed):.1f}",
                               "-".join(f"{b:.0f}" for b in bounds) or "-",
                               kinds["slow"]]))
    return "\n".join(checks), "\n".join(leaks), "\n".join(times)


def summary(outcomes):
    struck = [o for o in outcomes if counted(o)]
    failed = [o for o in struck if not o["ok"]]
    commits = sorted({o.get("commit", "?") for o in outcomes})
    apart = [o for o in outcomes if not counted(o) and o["problems"]]
    return (f"{len(outcomes)} rounds (seeds {sorted({o['seed'] for o in outcomes})}, commit "
            f"{', '.join(commits)}), {sum(o['seconds'] for o in outcomes) / 60:.0f} minutes of "
            f"runs: {len(struck)} counted (their fault struck, or none), "
            f"{len(outcomes) - len(struck)} unstruck (not counted); {len(failed)} counted "
            f"rounds failed"
            + (f"; {len(apart)} unstruck rounds had problems (listed below)" if apart else ""))


def markdown(outcomes):
    checks, leaks, times = tables(outcomes)
    failed = [o for o in outcomes if o["problems"]]
    listed = "\n".join(f"- seed {o['seed']}, round {o['round']} ({o['fault']}, {o['launcher']}, "
                       f"{o['program']}{', unstruck' if not counted(o) else ''}): "
                       f"{'; '.join(' '.join(p.split())[:200] for p in o['problems'])}"
                       for o in failed)
    return (f"{summary(outcomes)}.\n\nThe checks:\n\n{checks}\n\nThe leaks looked for after "
            f"each round:\n\n{leaks}\n\nSeconds from the fault to the error (the run's end; an "
            f"elastic run: its world formed again), of struck rounds:\n\n{times}\n"
            + (f"\nRounds with problems:\n\n{listed}\n" if listed else ""))


def rewrite(path, text):
    """Put `text` between RELIABILITY.md's table markers."""
    with open(path) as f:
        old = f.read()
    if BEGIN not in old:
        raise SystemExit(f"{path} has no '{BEGIN}' ... '{END}' markers")
    new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END),
                 lambda _: f"{BEGIN}\n{text}\n{END}", old, flags=re.S)
    with open(path, "w") as f:
        f.write(new)
