"""`make bench`: run every benchmark, one at a time, and write BENCHMARKS.md and BENCHMARKS.json.

Each benchmark is its own script (``bench/bench_*.py``) and runs in a process of its own, never
two at once (they would measure each other). Every script takes ``--json PATH`` and writes a list
of rows (`bench/rows.py`: ``bench``, ``name``, ``np``, ``median``, ``best``, ``ratio`` to that
bench's reference, and its own extra fields); BENCHMARKS.json holds all of them with the machine
and the commit, and BENCHMARKS.md is generated from that file alone (``--from-json`` redoes it
without measuring). A benchmark that fails, or is missing, is reported in the file, not hidden.

The section of BENCHMARKS.md between ``<!-- reading -->`` and ``<!-- /reading -->`` is written by
a person, from a run's numbers: it is kept as it is when the file is regenerated, so say in it
which run it reads.

    .venv/bin/python bench/run_all.py            # the full set, ~80 minutes on 2 cores
    .venv/bin/python bench/run_all.py --quick    # fewer repetitions and sizes, ~10 minutes
    .venv/bin/python bench/run_all.py --only launch training --out /tmp/B.md
    .venv/bin/python bench/run_all.py --from-json BENCHMARKS.json   # the .md again, no runs
    .venv/bin/python bench/run_all.py --only elastic --merge   # measure one again, keep the rest
    .venv/bin/python bench/run_all.py --only sweeps --merge --ray ~/.cache/hvd_magic/ray-bench/bin/python

With ``--merge`` the benchmarks named are measured and replace their earlier results in the
.json beside ``--out``; the others are kept, and the file says of each benchmark measured apart
from the full run when and at which commit it was. ``--ray PYTHON`` names an interpreter that
has Ray (not in the project's venv): the sweeps benchmark runs the same sweep under Ray Tune too.

hvd_magic is imported from wherever the interpreter finds it; the file names the commit (and says
when the working tree differed from it, or changed during the run). To measure one commit while
others edit the tree, run from a clone of it:

    git clone -q --shared . /tmp/hvd_snap && cd /tmp/hvd_snap && \\
        PYTHONPATH=/tmp/hvd_snap /work/main/.venv/bin/python bench/run_all.py --out /work/main/BENCHMARKS.md
"""

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time

from markdown import render

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PY = sys.executable

# name -> (script, full arguments, --quick arguments). Every script takes --json PATH.
BENCHMARKS = {
    "launch": ("bench_launch.py", ["--np", "1", "2", "4", "8", "--reps", "3", "--profile", "2",
                                   "--skip", "TD-barrier@8", "horovodrun-H@1", "horovodrun-H@4",
                                   "horovodrun-H@8"],
               ["--np", "1", "2", "4", "--reps", "2", "--profile", "1",
                "--skip", "horovodrun-H", "horovodrun-c5", "horovod.run"]),
    # np 1-16 on 4 simulated hosts (needs root for network namespaces; says so when it cannot)
    "multihost": ("bench_multihost.py", ["--np", "1", "2", "4", "8", "16", "--reps", "2"],
                  ["--np", "1", "4", "16", "--reps", "1"]),
    "training": ("bench_training.py", ["--np", "2", "4", "--reps", "4", "--steps", "300",
                                       "--frameworks", "torch", "keras"],
                 ["--np", "2", "4", "--reps", "1", "--steps", "300", "--frameworks", "torch", "keras"]),
    # a CNN's img/s with default threads: hvd-run (Spark, driver) beside horovodrun (issue #43)
    "threads": ("bench_threads.py", ["--np", "1", "2", "4", "--reps", "3"],
                ["--np", "1", "2", "4", "--reps", "1"]),
    "timeline": ("bench_timeline.py", [], ["--reps", "1", "--steps", "200"]),
    "logs": ("bench_logs.py", [], ["--reps", "1", "--lines", "20000"]),
    "payload": ("bench_payload.py", ["--reps", "3", "--np", "4"],
                ["--mb", "200", "--reps", "1", "--np", "4"]),
    "session": ("bench_session.py", ["--np", "2", "4", "--reps", "50", "--spark"],
                ["--np", "2", "--reps", "10"]),
    "report": ("bench_report.py", [], ["--calls", "20000", "--reps", "2"]),
    # time to every rank's Python stack, free and with a rank holding the GIL, real ranks and
    # (np 16, 64) simulated ones; training steps/s with the stacks machinery and without (#38)
    "stacks": ("bench_stacks.py", ["--np", "2", "8", "16", "--sim-np", "16", "64", "--reps", "5",
                                   "--training-reps", "6"],
               ["--np", "2", "--sim-np", "16", "--reps", "3", "--training-reps", "1",
                "--steps", "200"]),
    "reinit": ("bench_reinit.py", [], ["--cycles", "20", "--loops", "1", "--skew-runs", "3",
                                       "--np", "2"]),
    "scripts": ("bench_scripts.py", ["--reps", "5", "--points", "1000"],
                ["--reps", "2", "--points", "400"]),
    # torch.distributed (issue #37): DDP steps/s beside torchrun, a DDP cell's launch beside the
    # floor and TorchDistributor
    "ddp": ("bench_ddp.py", ["--np", "1", "2", "4", "--train-np", "2", "4", "--reps", "3"],
            ["--np", "2", "--train-np", "2", "--reps", "1", "--steps", "50"]),
    "elastic": ("bench_elastic.py", ["--reps", "3", "--cost-reps", "5"],
                ["--reps", "1", "--cost-reps", "2", "--cost-steps", "300"]),
    # elastic torch.distributed without Horovod (hvd_magic.elastic, #53): recovery beside
    # torchrun's restart of every worker, on the driver and on Spark; cost when nothing fails
    "elastic-ddp": ("bench_elastic_ddp.py", ["--reps", "3", "--cost-reps", "5"],
                    ["--reps", "1", "--cost-reps", "2", "--cost-steps", "300"]),
    # --- DataFrame shards (issue #17): bench/bench_shards.py, when it exists, writes the same
    # rows (bench "shards": shard throughput, ratio to toPandas()) and takes --json PATH and
    # --quick; until then the file notes it as not run, and make bench does not fail for it.
    "shards": ("bench_shards.py", ["--reps", "3"], ["--quick"]),
    # pip install of the wheel into a user's environment that has torch and pyspark (#49)
    "install": ("bench_install.py", ["--reps", "3", "--fresh"], ["--reps", "1"]),
    # training steps/s with every rank's resources sampled and without (#50)
    "resources": ("bench_resources.py", ["--reps", "6"], ["--reps", "2", "--steps", "200"]),
    # the first cell of a new kernel, Spark started at load or by the cell (#51)
    "first-cell": ("bench_first_cell.py", ["--reps", "3"], ["--reps", "1"]),
    # --timeline of torch code without Horovod: its cost, its files, merging and drawing (#64)
    "timeline-ranks": ("bench_timeline_ranks.py", ["--reps", "5"], ["--reps", "2"]),
    "timeline-ranks-tf": ("bench_timeline_ranks.py", ["--framework", "tensorflow", "--reps", "3"],
                          ["--framework", "tensorflow", "--reps", "2"]),
    # the notebook's packages sent to a cluster's executors that lack them, beside installed (#65)
    "shipping": ("bench_shipping.py", ["--reps", "5"], ["--reps", "1"]),
    # 8 trials × 2 ranks, 2 at once, against one after another and the ideal (issue #83)
    "sweeps": ("bench_sweeps.py", ["--reps", "3"], ["--reps", "1"]),
    # DeepSpeed ZeRO-2 beside torchrun, JAX's psum beside processes started by hand, the first
    # DeepSpeed run's wait with an empty and a warm op folder (#82)
    "jaxds": ("bench_jaxds.py", ["--reps", "3"], ["--reps", "1", "--steps", "100"]),
    # the same ZeRO-2 loop in turns of half a second, every launcher's ranks alive at once: each
    # hvd_magic turn against the torchrun turns beside it (the minutes' noise cancels) (#82)
    "ds-turns": ("bench_ds_turns.py", ["--turns", "60"], ["--turns", "6"]),
    # the driver side at np 64-1024 simulated ranks (issue #29)
    "scale": ("bench_scale.py", ["--np", "64", "256", "1024"], ["--quick"]),
    # that dashboard's updates replayed in Chromium: frame time, DOM size (issue #29)
    "browser": ("bench_browser.py", ["--np", "64", "256", "1024"], ["--quick"]),
}


def run_benchmark(name, quick, tmp, ray=None):
    script, full, fast = BENCHMARKS[name]
    path = os.path.join(HERE, script)
    if not os.path.exists(path):
        return {"name": name, "ok": name == "shards", "missing": True, "seconds": 0,
                "output": f"{script} does not exist (yet)", "rows": []}
    args = (fast if quick else full) + (["--ray", ray] if ray and name == "sweeps" else [])
    out_json = os.path.join(tmp, f"{name}.json")
    cmd = [PY, path, *args, "--json", out_json]
    shown = " ".join([".venv/bin/python", f"bench/{script}", *args])
    print(f"\n== {name}: {shown}", flush=True)
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
    rows = []
    if os.path.exists(out_json):
        with open(out_json) as f:
            rows = json.load(f)
    return {"name": name, "ok": proc.returncode == 0, "command": shown,
            "seconds": time.perf_counter() - start, "output": "".join(lines)[-6000:], "rows": rows,
            "load_after": os.getloadavg()[0]}


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
    cpu = "?"
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
    import platform
    return {
        "cores": os.cpu_count(), "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "cpu": cpu, "os": platform.platform(), "python": platform.python_version(),
        "torch": _version("torch"), "tensorflow": _version("tensorflow"),
        "horovod": f"{_version('horovod')} ({build})", "pyspark": _version("pyspark"),
        "java": java, "IPython": _version("IPython"), "numpy": _version("numpy"),
        "pyarrow": _version("pyarrow"), "ipyparallel": _version("ipyparallel"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and sizes")
    parser.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="just these")
    parser.add_argument("--out", default=os.path.join(ROOT, "BENCHMARKS.md"))
    parser.add_argument("--merge", action="store_true",
                        help="with --only: replace just those in --out's .json, keep the others")
    parser.add_argument("--from-json", metavar="PATH",
                        help="write --out from a BENCHMARKS.json of an earlier run; measure nothing")
    parser.add_argument("--ray", metavar="PYTHON",
                        help="an interpreter with ray[tune,train] and torch: the sweeps "
                             "benchmark runs its sweep under Ray Tune too")
    args = parser.parse_args()
    out_json = os.path.splitext(args.out)[0] + ".json"

    if args.merge and not args.only:
        parser.error("--merge goes with --only: which benchmarks to measure again")
    if args.from_json:
        with open(args.from_json) as f:
            record = json.load(f)
    elif args.merge:  # measured first; then, held alone, the files as they are now get them
        measured = remeasured(args.only, args.quick, args.ray)
        with _held(out_json):
            with open(out_json) as f:
                record = json.load(f)
            record["benchmarks"].update(measured)
            _write(out_json, json.dumps(record, indent=1))
            _write(args.out, render(record, kept_reading(args.out)))
    else:
        started = datetime.datetime.now()
        version = hvd_magic_version()
        record = {"started": f"{started:%Y-%m-%d %H:%M}", "argv": sys.argv[1:], "quick": args.quick,
                  "load_before": os.getloadavg()[0], "benchmarks": {}}
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            for name in args.only or BENCHMARKS:
                record["benchmarks"][name] = run_benchmark(name, args.quick, tmp, args.ray)
        record["machine"] = machine()
        record["machine"]["hvd_magic"] = version
        if hvd_magic_version() != version:
            record["machine"]["hvd_magic"] += (f" at the start, {hvd_magic_version()} at the end "
                                               "(it changed during the run)")
        with open(out_json, "w") as f:
            json.dump(record, f, indent=1)
    if not args.merge:
        _write(args.out, render(record, kept_reading(args.out)))
    failed = [n for n, r in record["benchmarks"].items() if not r["ok"]]
    print(f"\nwrote {args.out}" + ("" if args.from_json else f" and {out_json}")
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def remeasured(names, quick, ray=None):
    """The benchmarks `names` measured again, each saying when and at which commit (the
    record's own date and machine stay the full run's)."""
    started, version = datetime.datetime.now(), hvd_magic_version()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        for name in names:
            results[name] = run_benchmark(name, quick, tmp, ray)
            results[name]["measured"] = f"{started:%Y-%m-%d %H:%M}, {version}"
    return results


@contextlib.contextmanager
def _held(path):
    """`path`'s lock file held: two merges at once each keep the other's rows."""
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write(path, text):
    """`path`'s new text, whole or not at all (a reader never sees half of it)."""
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


READING_START, READING_END = "<!-- reading -->", "<!-- /reading -->"


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


if __name__ == "__main__":
    sys.exit(main())
