"""What ``--timeline`` costs a torch run without Horovod (every rank's profile, merged): the step
time of the profiled steps and of the steps after them, against the same steps of the same cell
without ``--timeline``; the size of each rank's file and of the merged trace; the notebook's
time to merge and to draw them.

A DDP loop over Gloo (a three-layer MLP, 512 wide) on ``--np -2``; each rank times its own steps.
The cases are interleaved, repetition by repetition.

    .venv/bin/python bench/bench_timeline_ranks.py [--reps 3] [--steps 30] [--json PATH]

Not a test: timings live here only.
"""

import argparse
import gzip
import os
import statistics
import sys
import time

from rows import row, write

CELL = """\
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
layers = [torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
          torch.nn.Linear(512, 1)]
model = DDP(torch.nn.Sequential(*layers))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
took = []
for step in range(steps):
    start = time.perf_counter()
    optimizer.zero_grad()
    model(torch.randn(64, 512)).sum().backward()
    optimizer.step()
    took.append(time.perf_counter() - start)
took
"""
PROFILED = (10, 14)  # --timeline-steps 10:14


def one_run(ip, steps, timeline):
    """Rank 0's step times; with `timeline`, the run's merged file and its ranks' files too."""
    import hvd_magic

    ip.user_ns["steps"] = steps
    options = f"--np -2 --quiet{' --timeline-steps %d:%d' % PROFILED if timeline else ''}"
    took = ip.run_cell_magic("horovod", options, CELL)
    return took, hvd_magic.last_run()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json")
    args = parser.parse_args()
    from IPython.testing.globalipapp import start_ipython

    from hvd_magic.timelines import ranks, ranks_picture

    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    one_run(ip, 5, False)  # (the template and the first imports: not measured)
    first, last = PROFILED[0] - 1, PROFILED[1]  # indexes of the profiled steps: [first, last)
    cases = {False: {"profiled": [], "after": []}, True: {"profiled": [], "after": []}}
    sizes, merged, merge_s, draw_s = [], [], [], []
    for rep in range(args.reps):
        for timeline in ([False, True] if rep % 2 == 0 else [True, False]):
            took, run = one_run(ip, args.steps, timeline)
            cases[timeline]["profiled"].append(statistics.median(took[first:last]))
            cases[timeline]["after"].append(statistics.median(took[last + 1:]))
            if timeline:
                sizes += [os.path.getsize(os.path.join(run.run_dir, "profile", f"rank-{r}",
                                                       "trace.json")) for r in range(2)]
                merged.append(os.path.getsize(run.timeline_path))
                clocks = [r.clock for r in run.ranks]
                start = time.perf_counter()
                ranks.merge(run.run_dir, clocks)
                merge_s.append(time.perf_counter() - start)
                start = time.perf_counter()
                timeline_read = ranks.RanksTimeline.load(run.timeline_path)
                ranks_picture.svg(timeline_read)
                ranks_picture.table(timeline_read)
                draw_s.append(time.perf_counter() - start)
            print(f"timeline={timeline}: profiled steps {cases[timeline]['profiled'][-1]*1e3:.2f}"
                  f" ms, after {cases[timeline]['after'][-1]*1e3:.2f} ms", file=sys.stderr)
    rows = []
    for part in ("profiled", "after"):
        without = statistics.median(cases[False][part])
        for timeline in (False, True):
            name = (f"step time, {'the profiled steps' if part == 'profiled' else 'after them'}, "
                    f"{'with' if timeline else 'without'} --timeline")
            rows.append(row("timeline-ranks", name, 2, [v * 1e3 for v in cases[timeline][part]],
                            unit="ms", ref=without * 1e3))
            print(f"{name}: median {statistics.median(cases[timeline][part]) * 1e3:.2f} ms, "
                  f"best {min(cases[timeline][part]) * 1e3:.2f} ms")
    rows.append(row("timeline-ranks", "merging, in the notebook", 2, [v * 1e3 for v in merge_s],
                    unit="ms"))
    rows.append(row("timeline-ranks", "reading and drawing, in the notebook", 2,
                    [v * 1e3 for v in draw_s], unit="ms"))
    rows.append(row("timeline-ranks-files", "a rank's profile (5 steps)", 2,
                    [v / 1024 for v in sizes], unit="KB"))
    rows.append(row("timeline-ranks-files", "the merged trace, gzipped", 2,
                    [v / 1024 for v in merged], unit="KB"))
    print(f"a rank's profile: median {statistics.median(sizes) / 1024:.0f} KB; merged, gzipped: "
          f"{statistics.median(merged) / 1024:.0f} KB; merge {statistics.median(merge_s):.3f} s; "
          f"read and draw {statistics.median(draw_s):.3f} s")
    write(args.json, rows)


if __name__ == "__main__":
    main()
