"""What sampling every rank's resources costs training (issue #50): rank 0's steps/s at np -2,
with each task's sampler (`hvd_magic.task.resources`, a psutil read of the rank's process tree
each second) and without (``HVD_MAGIC_NO_RESOURCES=1``, a bench switch only), interleaved.

    .venv/bin/python bench/bench_resources.py [--reps 6] [--steps 500] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rows import rows_against, write  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.chdir(os.environ.get("TMPDIR", "/tmp"))  # the run folders land there

    import bench_training
    import cloudpickle
    import hvd_magic
    from hvd_magic.view.text import TextView

    cloudpickle.register_pickle_by_value(bench_training)  # the ranks cannot import bench/
    table = {"sampled": {2: []}, "not-sampled": {2: []}}
    for rep in range(args.reps):
        # alternate which goes first: neither always meets the machine's load first
        for name in (("sampled", "not-sampled") if rep % 2 == 0 else ("not-sampled", "sampled")):
            if name == "not-sampled":
                os.environ["HVD_MAGIC_NO_RESOURCES"] = "1"  # read by the driver's tasks
            try:
                run = hvd_magic.run(bench_training.train, np=-2, args=(args.steps, 50),
                                    view=TextView(quiet=True))
            finally:
                os.environ.pop("HVD_MAGIC_NO_RESOURCES", None)
            table[name][2].append(run.results[0]["steps_per_s"])
            print(f"rep {rep} {name}: {table[name][2][-1]:.1f} steps/s", flush=True)
    rows = rows_against("resources-cost", table, "not-sampled", unit="steps/s", better="higher",
                        reps=args.reps, steps=args.steps)
    pairs = [a / b for a, b in zip(table["sampled"][2], table["not-sampled"][2])]
    rows[0]["paired_ratio"] = statistics.median(pairs)
    for r in rows:
        print(f"{r['name']:>12}: median {r['median']:.1f} steps/s, best {r['best']:.1f}, "
              f"ratio {r['ratio']:.3f}, paired ratio {r.get('paired_ratio', 1):.3f}")
    write(args.json, rows)


if __name__ == "__main__":
    main()
