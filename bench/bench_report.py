"""What `hvd_magic.report()` costs a rank: per call, and as a share of a 5 ms training step.

A rank calls ``report(step=i, loss=..., acc=...)`` N times (every point reaches the driver, batched
ten times a second) and times the loop; the same loop without the call is the reference.
Repetitions alternate; medians and best-of are printed.

    .venv/bin/python bench/bench_report.py [--calls 100000] [--reps 5] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import json

import hvd_magic
from hvd_magic.view import TextView
from rows import row as make_row, write


def loop(calls, with_report):
    import time
    import hvd_magic
    start = time.perf_counter()
    for i in range(calls):
        loss = 1.0 / (i + 1)
        if with_report:
            hvd_magic.report(step=i, loss=loss, acc=1.0 - loss)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    timed = {True: [], False: []}
    for _ in range(args.reps):
        for with_report in (True, False):
            run = hvd_magic.run(loop, np=-1, args=(args.calls, with_report),
                                view=TextView(quiet=True))
            timed[with_report].append(run.value / args.calls)
            if with_report:
                assert len(run.metrics) == 2 * args.calls  # every point arrived
    per_call = [a - b for a, b in zip(timed[True], timed[False])]
    # Its ratio is to a 5 ms training step: the share of such a step one call takes.
    row = make_row("report", "report(step, 2 metrics) per call", 1, per_call, ref=0.005,
                   reps=args.reps, calls=args.calls)
    print(json.dumps(row))
    print(f"report(): {row['median'] * 1e6:.2f} us per call (best {row['best'] * 1e6:.2f}), "
          f"{row['ratio'] * 100:.3f}% of a 5 ms step")
    write(args.json, [row])


if __name__ == "__main__":
    main()
