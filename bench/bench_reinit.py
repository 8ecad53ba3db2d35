"""Re-initialising Horovod under load, and how far apart ranks reach hvd.init().

1. Cycles: each rank runs ``hvd.init(); allreduce; hvd.shutdown()`` in a loop, with CPU-hungry
   processes beside them (two busy loops on a 2-core machine); a run that aborts or hangs is a
   failure (``--cycle-timeout`` bounds a hang). Reported per launcher: cycles run, failures.
2. Skew: the seconds between the first and the last rank calling ``hvd.init()`` in a fresh run
   (process start, ``import torch``), under the same load: what HOROVOD_GLOO_TIMEOUT_SECONDS and
   the watchdog's hvd.init() threshold must leave room for.

    .venv/bin/python bench/bench_reinit.py [--cycles 300] [--loops 3] [--skew-runs 10] [--np 2 4]

Not a test: numbers live here only.
"""

import argparse
import json
import subprocess
import sys
import time

import hvd_magic
from hvd_magic.view import TextView
from rows import row, write


def cycles(n):
    import torch
    import horovod.torch as hvd
    for cycle in range(n):
        hvd.init()
        total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name=f"cycle{cycle}").item()
        assert total == hvd.size(), total
        hvd.shutdown()
    return n


def entered_init():
    import time
    import horovod.torch as hvd  # imports torch: most of a rank's start-up
    t = time.time()
    hvd.init()
    return t


def hogs(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--loops", type=int, default=3)
    parser.add_argument("--skew-runs", type=int, default=10)
    parser.add_argument("--np", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--hogs", type=int, default=2)
    parser.add_argument("--cycle-timeout", type=float, default=600)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    rows = []
    busy = hogs(args.hogs)
    try:
        for launcher, np in (("driver-only", -2), ("spark", 2)) if args.cycles else ():
            failures, done, seconds = 0, 0, []
            for _ in range(args.loops):
                start = time.perf_counter()
                try:
                    run = hvd_magic.run(cycles, np=np, args=(args.cycles,), view=TextView(quiet=True),
                                        timeout=args.cycle_timeout)
                    done += run.value
                except hvd_magic.HorovodMagicError as exc:
                    failures += 1
                    print(f"{launcher}: failed: {str(exc).splitlines()[0]}", flush=True)
                seconds.append(time.perf_counter() - start)
            rows.append(row("reinit", f"init/shutdown cycles, {launcher}", abs(np), seconds,
                            loops=args.loops, cycles=done, failures=failures))
            print(json.dumps(rows[-1]), flush=True)
        for np in args.np:
            for launcher, sign in (("driver-only", -1), ("spark", 1)):
                skews = []
                for _ in range(args.skew_runs):
                    run = hvd_magic.run(entered_init, np=sign * np, view=TextView(quiet=True))
                    skews.append(max(run.results) - min(run.results))
                rows.append(row("reinit", f"hvd.init() skew, {launcher}", np, skews,
                                worst=max(skews)))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for hog in busy:
            hog.kill()
    write(args.json, rows)


if __name__ == "__main__":
    main()
