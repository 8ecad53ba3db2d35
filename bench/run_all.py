"""`make bench`: run every benchmark, one at a time, and write BENCHMARKS.md.

Each benchmark is its own script (``bench/bench_*.py``) and runs in a process of its own, never
two at once (they would measure each other). The four of this folder that write ``--json`` feed
the tables; the output of the others (bench_logs.py, bench_timeline.py) is parsed for the targets
and quoted as it is. A benchmark that fails, or is missing, is reported in the file, not hidden.

The section of BENCHMARKS.md between ``<!-- reading -->`` and ``<!-- /reading -->`` is written by
a person, from a run's numbers: it is kept as it is when the file is regenerated, so say in it
which run it reads.

    .venv/bin/python bench/run_all.py            # the full set, ~20 minutes on 2 cores
    .venv/bin/python bench/run_all.py --quick    # fewer repetitions and sizes, ~6 minutes
    .venv/bin/python bench/run_all.py --only launch training --out /tmp/B.md

hvd_magic is imported from wherever the interpreter finds it; the file names the commit (and says
when the working tree differed from it, or changed during the run). To measure one commit while
others edit the tree, run from a clone of it:

    git clone -q --shared . /tmp/hvd_snap && cd /tmp/hvd_snap && \
        PYTHONPATH=/tmp/hvd_snap /work/main/.venv/bin/python bench/run_all.py --out /work/main/BENCHMARKS.md
"""

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable

# name -> (script, full arguments, --quick arguments, writes --json?)
BENCHMARKS = {
    "launch": ("bench_launch.py", ["--np", "1", "2", "4", "8", "--reps", "3", "--profile", "2",
                                   "--skip", "TD-barrier@8", "horovodrun-H@1", "horovodrun-H@4",
                                   "horovodrun-H@8"],
               ["--np", "2", "4", "--reps", "1", "--profile", "1"], True),
    "training": ("bench_training.py", ["--np", "2", "4", "--reps", "4", "--steps", "300"],
                 ["--np", "2", "--reps", "1", "--steps", "300"], True),
    "timeline": ("bench_timeline.py", [], ["--reps", "1", "--steps", "200"], False),
    "logs": ("bench_logs.py", [], ["--reps", "1", "--lines", "20000"], False),
    "payload": ("bench_payload.py", ["--reps", "3"], ["--mb", "10", "100", "--reps", "1"], True),
}
TARGETS = "launch ≤ 1.2× the floor and faster than horovodrun and TorchDistributor's barrier mode; " \
          "training ≥ 1.0× horovodrun; timeline ≤ 5% cost; zero lines lost"
READING_START, READING_END = "<!-- reading -->", "<!-- /reading -->"


def run_benchmark(name, quick, tmp):
    script, full, fast, writes_json = BENCHMARKS[name]
    path = os.path.join(HERE, script)
    if not os.path.exists(path):
        return {"name": name, "ok": False, "output": f"{script} does not exist (yet)", "seconds": 0}
    cmd = [PY, path, *(fast if quick else full)]
    out_json = os.path.join(tmp, f"{name}.json")
    if writes_json:
        cmd += ["--json", out_json]
    print(f"\n== {name}: {' '.join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd)}",
          flush=True)
    start = time.perf_counter()
    lines = []
    # Its own session: if this script is interrupted, what the benchmark started goes with it.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            lines.append(line)
            print(f"  {line}", end="", flush=True)
        proc.wait()
    except BaseException:
        os.killpg(proc.pid, 9)
        proc.wait()
        raise
    result = {"name": name, "ok": proc.returncode == 0, "command": cmd,
              "seconds": time.perf_counter() - start, "output": "".join(lines)}
    if writes_json and os.path.exists(out_json):
        with open(out_json) as f:
            result["data"] = json.load(f)
    return result


# --- what the machine is ------------------------------------------------------------------

def _version(module):
    try:
        return __import__(module).__version__
    except Exception:
        return "not installed"


def hvd_magic_version():
    """The commit of the hvd_magic this interpreter imports, and whether its files differ from it
    (other engineers edit the working tree while benchmarks run: say what was measured)."""
    import hvd_magic
    tree = os.path.dirname(os.path.dirname(os.path.abspath(hvd_magic.__file__)))

    def git(*args):
        return subprocess.run(["git", "-C", tree, *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return f"{tree} (not a git checkout)"
    dirty = git("status", "--porcelain", "--", "hvd_magic")
    return f"commit {commit} in {tree}" + (" plus uncommitted changes" if dirty else "")


def machine():
    import psutil
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()[0]
    except (OSError, IndexError):
        java = "?"
    try:
        with open(os.path.join(sys.prefix, ".horovod-key")) as f:
            build = os.path.basename(f.read().strip())
    except OSError:
        build = "unknown build"
    return {
        "cores": os.cpu_count(), "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "cpu": cpu, "os": platform.platform(), "python": platform.python_version(),
        "torch": _version("torch"), "horovod": f"{_version('horovod')} ({build})",
        "pyspark": _version("pyspark"), "java": java, "IPython": _version("IPython"),
        "numpy": _version("numpy"), "pyarrow": _version("pyarrow"),
    }


# --- the tables ---------------------------------------------------------------------------

def _f(x, digits=2):
    return "–" if x is None else f"{x:.{digits}f}"


def launch_section(r):
    d = r["data"]
    nps = d["np"]
    med = {name: {int(k): v for k, v in by_np.items()} for name, by_np in d["medians"].items()}
    floor = med.get("floor", {})
    out = [f"Wall seconds of the launching call, median of {d['reps']} interleaved repetitions "
           f"(in brackets: ratio to the floor). Trivial cell: `hvd.init()` + one allreduce.", "",
           "| launcher | " + " | ".join(f"np={n}" for n in nps) + " |",
           "|---|" + "---:|" * len(nps)]
    for name, by_np in med.items():
        cells = []
        for n in nps:
            v = by_np.get(n)
            cells.append("–" if v is None else
                         f"{v:.2f} ({v / floor[n]:.2f}×)" if floor.get(n) else f"{v:.2f}")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    best = {name: {int(k): min(v) for k, v in by_np.items() if v} for name, by_np in d["times"].items()}
    out += ["", f"The same, best of the {d['reps']} (load spikes on a shared machine only ever add "
                f"time, so the minimum is the steadier estimate of what a launcher costs):", "",
            "| launcher | " + " | ".join(f"np={n}" for n in nps) + " |",
            "|---|" + "---:|" * len(nps)]
    for name, by_np in best.items():
        cells = []
        for n in nps:
            v, base = by_np.get(n), best.get("floor", {}).get(n)
            cells.append("–" if v is None else f"{v:.2f} ({v / base:.2f}×)" if base else f"{v:.2f}")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    skipped = [a for a in r["command"][r["command"].index("--skip") + 1:] if "@" in a] \
        if "--skip" in r["command"] else []
    if skipped:
        out += ["", "–: not run (`--skip " + " ".join(skipped) + "`; see the reading above)."]
    if d.get("errors"):
        out += ["", "Failures: " + "; ".join(f"{k}: {v[:200]}" for k, v in d["errors"].items())]
    if d.get("spark_start") is not None:
        out += ["", f"The embedded Spark session (local[{max(nps)}]) took {d['spark_start']:.1f} s "
                    f"to start, once, before the timings (not counted: a warm session)."]
    if d.get("profile"):
        out += ["", "**Where a launch goes** (np=2; seconds since the call, medians of "
                    f"{r['command'][r['command'].index('--profile') + 1]} runs):", ""]
        names = list(d["profile"])
        steps = []
        for name in names:
            for step in d["profile"][name]:
                if step not in steps:
                    steps.append(step)
        out += ["| step | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        for step in steps:
            out.append(f"| {step} | " + " | ".join(_f(d["profile"][n].get(step)) for n in names) + " |")
    return out


def training_section(r):
    d = r["data"]
    nps = d["np"]
    med = {name: {int(k): v for k, v in by_np.items()} for name, by_np in d["medians"].items()}
    base = med["horovodrun"]
    cpu = {name: {int(k): v for k, v in by_np.items()} for name, by_np in d["cpu_medians"].items()}
    out = [f"Rank 0's steps/s, {d['steps']} steps after {d['warmup']} (timed inside the rank), "
           f"median of {d['reps']} interleaved repetitions; in brackets: ratio to `horovodrun`; "
           f"then the lowest–highest of the repetitions, and rank 0's CPU time per step (all its "
           f"threads: a spinning Horovod loop shows here, and it is less sensitive than wall time "
           f"to the machine's other load).", "",
           "| launcher | " + " | ".join(f"np={n} steps/s | min–max | CPU ms/step" for n in nps) + " |",
           "|---|" + "---:|---:|---:|" * len(nps)]
    for name, by_np in med.items():
        raw = {int(k): v for k, v in d["rates"][name].items()}
        out.append(f"| {name} | " + " | ".join(
            f"{by_np[n]:.0f} ({by_np[n] / base[n]:.2f}×) | {min(raw[n]):.0f}–{max(raw[n]):.0f} | "
            f"{cpu[name][n]:.2f}" for n in nps) + " |")
    return out


def payload_section(r):
    d = r["data"]
    out = [f"`%%horovod --np 2` on embedded Spark in an IPython shell, reading a numpy array; "
           f"median of {d['reps']}. *driver*: call → run started (captured, pickled, broadcast); "
           f"*to rank*: call → the cell began on rank 0; *extra*: *to rank* minus the 8-byte "
           f"cell's; peak memory is the driver's, above its level before the cell.", "",
           "| value | by broadcast | driver s | to rank s | extra s | whole cell s | peak RSS MB "
           "| tracemalloc peak MB |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in d["rows"]:
        label = "8 B" if row["mb"] == 0 else f"{row['mb']:.0f} MB"
        out.append(f"| {label} | {'yes' if row['broadcast'] else 'no'} | {row['driver']:.2f} | "
                   f"{row['to_rank']:.2f} | {row['extra']:.2f} | {row['cell']:.2f} | "
                   f"{row['rss_peak_mb']:.0f} | {row['traced_peak_mb']:.0f} |")
    return out


def parse_timeline(output):
    """{setting: {column: value}} from bench_timeline's summary table (columns by its header,
    which is split on runs of 2+ spaces: its names have single spaces)."""
    header, rows = None, {}
    for line in output.splitlines():
        if line.startswith("setting") and "vs off" in line:
            header = re.split(r"\s{2,}", line.strip())
        elif header and re.match(r"(off|dynamic|full)\s", line):
            name, *values = line.split()
            try:
                rows[name] = dict(zip(header[1:], map(float, values)))
            except ValueError:
                continue
    return rows


def parse_logs(output):
    """[(ranks, ratio, lost)] from bench_logs' summary lines."""
    return [(int(m.group(1)), float(m.group(2)), int(m.group(3))) for m in re.finditer(
        r"^(\d+) ranks? at once:.*\(x([\d.]+)\).*lines lost: (\d+)", output, re.M)]


def quoted(r, last=None):
    text = r["output"].rstrip()
    lines = [line for line in text.splitlines() if not line.startswith("  rep ")]
    if last:
        lines = lines[-last:]
    return ["```", *lines, "```"]


def targets_section(results):
    """Each target: what was measured, and whether it is met."""
    out = ["| target | measured | met? |", "|---|---|---|"]

    def row(target, measured, ok):
        out.append(f"| {target} | {measured} | {'yes' if ok else '**no**' if ok is not None else '–'} |")

    launch = results.get("launch", {}).get("data")
    if launch:
        med = {n: {int(k): v for k, v in b.items()} for n, b in launch["medians"].items()}
        floor = med.get("floor", {})
        for name in ("hvd_magic-spark", "hvd_magic-driver"):
            if name not in med:
                continue
            ratios = {n: v / floor[n] for n, v in med[name].items() if floor.get(n)}
            row(f"{name} launch ≤ 1.2× floor",
                ", ".join(f"np={n}: {x:.2f}×" for n, x in ratios.items()),
                all(x <= 1.2 for x in ratios.values()))
            for rival in ("horovodrun", "horovodrun-c5", "TD-barrier"):
                if rival not in med:
                    continue
                pairs = {n: (v, med[rival][n]) for n, v in med[name].items() if n in med[rival]}
                row(f"{name} faster than {rival}",
                    ", ".join(f"np={n}: {a:.2f} vs {b:.2f} s" for n, (a, b) in pairs.items()),
                    all(a < b for a, b in pairs.values()) if pairs else None)
    training = results.get("training", {}).get("data")
    if training:
        med = {n: {int(k): v for k, v in b.items()} for n, b in training["medians"].items()}
        for name in ("hvd_magic-spark", "hvd_magic-driver"):
            ratios = {n: v / med["horovodrun"][n] for n, v in med[name].items()}
            row(f"{name} training ≥ 1.0× horovodrun",
                ", ".join(f"np={n}: {x:.2f}×" for n, x in ratios.items()),
                all(x >= 1.0 for x in ratios.values()))
    timeline = parse_timeline(results.get("timeline", {}).get("output", ""))
    for setting in ("dynamic", "full"):
        if "vs off" in timeline.get(setting, {}):
            ratio = timeline[setting]["vs off"]
            off = timeline["off"]
            spread = f"; without one, runs ranged {off['min']:.0f}–{off['max']:.0f} steps/s" \
                if "min" in off and "max" in off else ""
            row(f"timeline ({setting}) ≤ 5% cost",
                f"{ratio:.2f}× the median steps/s without a timeline{spread}", ratio >= 0.95)
    logs = parse_logs(results.get("logs", {}).get("output", ""))
    if logs:
        row("zero lines lost", ", ".join(f"{n} rank{'s' if n > 1 else ''}: {lost} lost"
                                         for n, _, lost in logs), all(lost == 0 for *_, lost in logs))
    return out


SECTIONS = [
    ("launch", "1. Launch overhead", launch_section),
    ("training", "2. Training throughput", training_section),
    ("timeline", "3. Timeline cost (bench/bench_timeline.py)", None),
    ("logs", "4. Log cost (bench/bench_logs.py)", None),
    ("payload", "5. Payload", payload_section),
]


def render(results, info, argv, started, loads, kept_reading):
    out = ["# Benchmarks", "",
           f"Generated by `make bench` (`{' '.join(['.venv/bin/python', 'bench/run_all.py', *argv])}`) "
           f"on {started:%Y-%m-%d %H:%M}; {sum(r['seconds'] for r in results.values()) / 60:.0f} min in all. "
           "Timings live here, never in tests. Every comparison runs in one script, A/B interleaved "
           "(the order rotates each repetition), and reports medians.", "",
           "**Machine**: " + "; ".join(f"{k} {v}" for k, v in info.items()) + ".", "",
           f"**Load average** (1 min) seen during the runs: {', '.join(f'{x:.1f}' for x in loads)}. "
           "The machine is shared (other engineers run test suites on it now and then), so "
           "single numbers are noisy; compare ratios within a table rather than across tables.", "",
           f"**Targets**: {TARGETS}.", ""]
    out += targets_section(results)
    out += ["", READING_START, kept_reading.strip() or "_(no reading written yet)_", READING_END, ""]
    for name, title, section in SECTIONS:
        if name not in results:
            continue
        r = results[name]
        out += [f"## {title}", ""]
        if not r["ok"]:
            out += [f"**It failed** (exit status or missing script); its last output:", "",
                    *quoted(r, last=30), ""]
            continue
        if section is not None and "data" in r:
            out += section(r)
        else:
            out += ["Its own summary, as printed:", "", *quoted(r)]
        script, full, fast, _ = BENCHMARKS[name]
        shown = " ".join([".venv/bin/python", f"bench/{script}", *(fast if "--quick" in argv else full)])
        out += ["", f"_`{shown}` took {r['seconds']:.0f} s._", ""]
    return "\n".join(out) + "\n"


def kept_reading(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return ""
    start, end = text.find(READING_START), text.find(READING_END)
    if start < 0 or end < start:
        return ""
    return text[start + len(READING_START):end]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and sizes")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="just these")
    parser.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    args = parser.parse_args()

    started = datetime.datetime.now()
    version = hvd_magic_version()
    loads = [os.getloadavg()[0]]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for name in args.only or BENCHMARKS:
            results[name] = run_benchmark(name, args.quick, tmp)
            loads.append(os.getloadavg()[0])
    info = machine()
    info["hvd_magic"] = version
    if hvd_magic_version() != version:
        info["hvd_magic"] += f" at the start, {hvd_magic_version()} at the end (it changed during the run)"
    text = render(results, info, sys.argv[1:], started, loads, kept_reading(args.out))
    with open(args.out, "w") as f:
        f.write(text)
    failed = [n for n, r in results.items() if not r["ok"]]
    print(f"\nwrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
