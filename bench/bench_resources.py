"""What sampling every rank's resources costs training (issue #50): rank 0's steps/s at np -2,
with each task's sampler (`hvd_magic.task.resources`, a psutil read of the rank's process tree
each second) and without (``HVD_MAGIC_NO_RESOURCES=1``, a bench switch only), interleaved.

    .venv/bin/python bench/bench_resources.py [--reps 6] [--steps 500] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from rows import write  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    os.chdir(os.environ.get("TMPDIR", "/tmp"))  # the run folders land there

    import bench_training

    rows = bench_training.cost_of("resources-cost", "HVD_MAGIC_NO_RESOURCES", "sampled",
                                  "not-sampled", args.reps, args.steps)
    for r in rows:
        print(f"{r['name']:>12}: median {r['median']:.1f} steps/s, best {r['best']:.1f}, "
              f"ratio {r['ratio']:.3f}, paired ratio {r.get('paired_ratio', 1):.3f}")
    write(args.json, rows)


if __name__ == "__main__":
    main()
