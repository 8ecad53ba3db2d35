"""What ``--timeline`` costs a torch run without Horovod (every rank's profile, merged): the step
time of the profiled steps and of the steps after them, against the same steps of the same cell
without ``--timeline``; the size of each rank's file and of the merged trace; the notebook's
time to merge and to draw them.

A DDP loop over Gloo (a three-layer MLP, 512 wide) on ``--np -2``; each rank times its own steps.
With ``--framework tensorflow``: the same model fitted by Keras under tf.distribute's
MultiWorkerMirroredStrategy (a step: a training batch, timed by a callback), TensorFlow's
profiler. The cases are interleaved, repetition by repetition.

    .venv/bin/python bench/bench_timeline_ranks.py [--reps 3] [--steps 30] [--json PATH]
                                                   [--framework torch|tensorflow]

Not a test: timings live here only.
"""

import argparse
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
TF_CELL = """\
import json, os, time
import numpy as np
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
import keras
rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
took = []

class Timed(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        took.append(time.perf_counter() - self.start)

with strategy.scope():
    model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(512, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
x = np.random.default_rng(rank).random((steps * 64, 513), dtype=np.float32)
data = tf.data.Dataset.from_tensor_slices((x[:, :512], x[:, 512:])).batch(64)
model.fit(data.with_options(options), epochs=1, verbose=0, callbacks=[Timed()])
took
"""
PROFILED = (10, 14)  # --timeline-steps 10:14


def one_run(ip, steps, timeline, cell=CELL):
    """Rank 0's step times; with `timeline`, the run's merged file and its ranks' files too."""
    import hvd_magic

    ip.user_ns["steps"] = steps
    options = f"--np -2 --quiet{' --timeline-steps %d:%d' % PROFILED if timeline else ''}"
    took = ip.run_cell_magic("horovod", options, cell)
    return took, hvd_magic.last_run()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch")
    parser.add_argument("--json")
    args = parser.parse_args()
    cell, bench = (TF_CELL, "timeline-ranks-tf") if args.framework == "tensorflow" else \
        (CELL, "timeline-ranks")
    from IPython.testing.globalipapp import start_ipython

    from hvd_magic.timelines import ranks, ranks_picture

    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    one_run(ip, 5, False, cell)  # (the template and the first imports: not measured)
    first, last = PROFILED[0] - 1, PROFILED[1]  # indexes of the profiled steps: [first, last)
    cases = {False: {"profiled": [], "after": []}, True: {"profiled": [], "after": []}}
    sizes, merged, merge_s, draw_s = [], [], [], []
    for rep in range(args.reps):
        for timeline in ([False, True] if rep % 2 == 0 else [True, False]):
            took, run = one_run(ip, args.steps, timeline, cell)
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
            rows.append(row(bench, name, 2, [v * 1e3 for v in cases[timeline][part]],
                            unit="ms", ref=without * 1e3))
            print(f"{name}: median {statistics.median(cases[timeline][part]) * 1e3:.2f} ms, "
                  f"best {min(cases[timeline][part]) * 1e3:.2f} ms")
    rows.append(row(bench, "merging, in the notebook", 2, [v * 1e3 for v in merge_s],
                    unit="ms"))
    rows.append(row(bench, "reading and drawing, in the notebook", 2,
                    [v * 1e3 for v in draw_s], unit="ms"))
    rows.append(row(bench + "-files", "a rank's profile (5 steps)", 2,
                    [v / 1024 for v in sizes], unit="KB"))
    rows.append(row(bench + "-files", "the merged trace, gzipped", 2,
                    [v / 1024 for v in merged], unit="KB"))
    print(f"a rank's profile: median {statistics.median(sizes) / 1024:.0f} KB; merged, gzipped: "
          f"{statistics.median(merged) / 1024:.0f} KB; merge {statistics.median(merge_s):.3f} s; "
          f"read and draw {statistics.median(draw_s):.3f} s")
    write(args.json, rows)


if __name__ == "__main__":
    main()
