"""What printing costs a rank under hvd_magic, and whether any line is lost.

A rank prints 100k short lines. Its own wall time for the print loop is measured inside the rank,
under hvd_magic (stdout is a pipe to its task, which forwards batches to the driver, which writes
``rank-<k>.log``) and for the same code printing to /dev/null in a fresh interpreter with the same
unbuffered stdout a rank gets. Repetitions are interleaved; medians are printed. Lines lost: lines
missing from (or out of order in) the rank's log; it must be 0.

    .venv/bin/python bench/bench_logs.py [--lines 100000] [--reps 5] [--ranks 1 4]

Not a test: timings live here only.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from rows import row, write


def emit(lines):
    """The rank's work: print `lines` lines; return the seconds the loop took."""
    import os
    import time
    rank = os.environ.get("HOROVOD_RANK", "0")
    start = time.perf_counter()
    for i in range(lines):
        print(f"rank {rank} line {i} of the flood")
    return time.perf_counter() - start


def lost_lines(path, rank, lines):
    """How many expected lines the log lacks, counting only those in the right order."""
    expected = (f"rank {rank} line {i} of the flood" for i in range(lines))
    want = next(expected, None)
    found = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if want is not None and line.rstrip("\n") == want:
                found += 1
                want = next(expected, None)
    return lines - found


def under_hvd_magic(lines, ranks, root):
    import hvd_magic
    run_dir = tempfile.mkdtemp(dir=root)
    start = time.perf_counter()
    run = hvd_magic.run(emit, np=-ranks, args=(lines,), run_dir=run_dir)
    wall = time.perf_counter() - start
    lost = sum(lost_lines(run.log_path(k), k, lines) for k in range(ranks))
    shutil.rmtree(run_dir)
    return max(run.results), wall, lost


def to_devnull(lines, ranks):
    """The same loop in `ranks` fresh interpreters at once, stdout to /dev/null."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")  # as a rank's stdout is
    procs = [subprocess.Popen([sys.executable, __file__, "--child", str(lines)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              env=dict(env, HOROVOD_RANK=str(k))) for k in range(ranks)]
    seconds = []
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(err)
        seconds.append(float(err.strip().splitlines()[-1]))
    return max(seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", help="write the rows here (bench/rows.py)")
    args = parser.parse_args()
    if args.child is not None:
        sys.stderr.write(f"{emit(args.child)}\n")
        return

    root = tempfile.mkdtemp(prefix="bench_logs-")
    rows = []
    try:
        print(f"{args.lines} lines per rank, {args.reps} interleaved repetitions, medians; "
              f"{os.cpu_count()} cores")
        for ranks in args.ranks:
            base, inside, walls, lost = [], [], [], 0
            for _ in range(args.reps):
                base.append(to_devnull(args.lines, ranks))
                seconds, wall, missing = under_hvd_magic(args.lines, ranks, root)
                inside.append(seconds)
                walls.append(wall)
                lost += missing
            b, h = statistics.median(base), statistics.median(inside)
            print(f"{ranks} rank{'s' if ranks > 1 else ''} at once: print loop {h:.3f} s under "
                  f"hvd_magic vs {b:.3f} s to /dev/null (x{h / b:.2f}); whole run "
                  f"{statistics.median(walls):.2f} s; lines lost: {lost}")
            rows.append(row("logs", "print loop to /dev/null", ranks, base, ref=b,
                            reps=args.reps, lines=args.lines))
            rows.append(row("logs", "print loop under hvd_magic", ranks, inside, ref=b,
                            reps=args.reps, lines=args.lines, lost=lost,
                            whole_run=statistics.median(walls)))
            if lost:
                raise SystemExit(f"{lost} lines were lost")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        write(args.json, rows)


if __name__ == "__main__":
    main()
