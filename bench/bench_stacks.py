"""Time to every rank's Python stack (issue #38): ``Run.stacks()`` on a running run.

Ranks on the driver launcher (``--np -N``), with real Horovod: every rank but the last waits in
an ``hvd.allreduce`` for the last, which sleeps in a function of its own (the hang that stacks are
asked for). Measured: the seconds `run.stacks()` takes to return every rank's stack, `--reps`
times, once the ranks are in place:

- ``python``: every rank answers from its helper thread (the GIL is free: the waits release it);
- ``gil-held``: the last rank is stuck in C code holding the GIL (a regular expression that
  backtracks), so its task falls back to faulthandler after its wait for the Python answer.

    .venv/bin/python bench/bench_stacks.py [--np 2 8] [--reps 10] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rows import row  # noqa: E402


def hang(gil):
    import re
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()

    def last_rank_busy():
        if gil:
            re.match(r"(a+)+$", "a" * 64 + "b")  # the `re` engine holds the GIL for ages
        time.sleep(600)

    if hvd.rank() == hvd.size() - 1:
        last_rank_busy()
    hvd.allreduce(torch.ones(2), name="grad")


def measure(np, gil, reps):
    import hvd_magic
    from hvd_magic.view.text import TextView

    run = hvd_magic.run(hang, np=-np, args=(gil,), background=True, view=TextView(quiet=True))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # until every rank is in place
            stacks = run.stacks()
            text = stacks.text()
            if "last_rank_busy" in text and (np == 1 or "→ allreduce" in text) \
                    and len(stacks) == np:
                break
            time.sleep(0.5)
        else:
            raise RuntimeError(f"the ranks never got in place:\n{text}")
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            stacks = run.stacks()
            times.append(time.perf_counter() - started)
            assert len(stacks) == np, stacks.text()
        print(f"np {np} {'gil-held' if gil else 'python'}: "
              f"{', '.join(f'{t * 1000:.0f}' for t in times)} ms", flush=True)
        return times
    finally:
        run.cancel()
        try:
            run.wait(120)
        except hvd_magic.RunCancelled:
            pass


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, nargs="+", default=[2, 8])
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.chdir(os.environ.get("TMPDIR", "/tmp"))  # the run folders land there
    rows = []
    for np in args.np:
        for gil in (False, True):
            times = measure(np, gil, args.reps)
            rows.append(row("stacks", "gil-held" if gil else "python", np, times, unit="s",
                            reps=args.reps))
    for r in rows:
        print(f"{r['name']:>9} np {r['np']}: median {r['median'] * 1000:.0f} ms, "
              f"best {r['best'] * 1000:.0f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
