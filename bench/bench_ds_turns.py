"""DeepSpeed ZeRO-2 under hvd_magic and under torchrun, measured in turns (#82).

On this shared machine the same run's steps/s moves by ±40% from one minute to the next, so
whole runs timed one after the other (bench_jaxds.py) compare the minutes more than the
launchers. Here every launcher's ranks are started once and live together; they take turns
(`--turn-steps` steps each, about half a second), one world at a time while the others wait
idle for their next turn, and each turn of hvd_magic is compared with the torchrun turns
beside it. A turn's rate is rank 0's steps over the time between two barriers.

- ``torchrun``: ``torchrun --nproc_per_node N`` of this script (the reference);
- ``hvd_magic-driver``: ``hvd_magic.run(turns, np=-N)``; ``hvd_magic-spark``: ``np=N`` on a
  local Spark session.

The launchers' own processes (hvd_magic's driver in this process, torchrun's agent, Spark's JVM)
run throughout, so what they cost falls on every world's turns alike: that is measured apart
(bench_dscpu.py). The coordinator here tells each world's rank 0, over a socket, when its turn
begins; its peers wait for it in a broadcast.

    .venv/bin/python bench/bench_ds_turns.py [--np 2] [--turns 40] [--turn-steps 50]
                                             [--launchers torchrun hvd_magic-driver ...]
                                             [--json PATH]

Not a test: timings live here only.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading

from bench_jaxds import extensions_env
from bench_launch import _Spark, scratch_runs
from rows import write

HERE = os.path.abspath(__file__)
LAUNCHERS = ("torchrun", "hvd_magic-driver", "hvd_magic-spark")


def turns(address, name):
    """A rank's part: DeepSpeed set up, then a turn of `steps` steps each time rank 0 is told
    "go STEPS" (every rank told by a broadcast), until "stop"; rank 0 answers each turn with its
    seconds. Returns the number of turns taken."""
    import time

    import torch
    import torch.distributed as dist

    from bench_jaxds import ds_step

    step = ds_step()
    for _ in range(10):  # warm-up
        step()
    conn = None
    if dist.get_rank() == 0:
        conn = socket.create_connection(tuple(address))
        conn.sendall(f"{name}\n".encode())
        reader = conn.makefile("r")
    taken = 0
    while True:
        order = torch.zeros(1, dtype=torch.int64)
        if conn is not None:
            words = reader.readline().split()
            order[0] = int(words[1]) if words and words[0] == "go" else 0
        dist.broadcast(order, 0)
        if order.item() == 0:
            return taken
        dist.barrier()
        start = time.perf_counter()
        for _ in range(order.item()):
            step()
        dist.barrier()
        if conn is not None:
            conn.sendall(f"{time.perf_counter() - start}\n".encode())
        taken += 1


class Coordinator:
    """Listens for each world's rank 0, then gives the worlds their turns in round-robin."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = self.server.getsockname()
        self.worlds = {}  # name -> (socket, reader)

    def wait_for(self, names, timeout=600):
        self.server.settimeout(timeout)
        while set(self.worlds) != set(names):
            conn, _ = self.server.accept()
            conn.settimeout(timeout)
            reader = conn.makefile("r")
            self.worlds[reader.readline().strip()] = (conn, reader)

    def turn(self, name, steps):
        conn, reader = self.worlds[name]
        conn.sendall(f"go {steps}\n".encode())
        return steps / float(reader.readline())

    def stop(self):
        for conn, _ in self.worlds.values():
            try:
                conn.sendall(b"stop\n")
            except OSError:
                pass


def start_world(name, np, coordinator, run_root, errors):
    """`name`'s ranks, started in a thread (they run until told to stop)."""
    def torchrun():
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={np}", HERE, "--child", *map(str, coordinator.address)]
        out = subprocess.run(cmd, env=extensions_env(), capture_output=True, text=True,
                             timeout=3600)
        if out.returncode:
            raise RuntimeError(f"torchrun exited with {out.returncode}: {out.stderr[-800:]}")

    def hvd_magic_world():
        import hvd_magic
        from hvd_magic.view import TextView
        hvd_magic.run(turns, np=-np if name == "hvd_magic-driver" else np,
                      args=(list(coordinator.address), name),
                      run_dir=tempfile.mkdtemp(dir=run_root), view=TextView(quiet=True))

    def guarded():
        try:
            torchrun() if name == "torchrun" else hvd_magic_world()
        except Exception as exc:  # said by the main thread, which waits for every world
            errors.append(f"{name}: {exc}")
    thread = threading.Thread(target=guarded, name=name, daemon=True)
    thread.start()
    return thread


def paired(rates, name, reference="torchrun"):
    """Each of `name`'s turns over the mean of the reference's turns just before and after it."""
    ratios = []
    for i, rate in enumerate(rates[name]):
        beside = rates[reference][i:i + 2]  # (the reference's turn i is before, i+1 after)
        ratios.append(rate / statistics.mean(beside))
    return ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--turn-steps", type=int, default=50)
    parser.add_argument("--launchers", nargs="+", default=list(LAUNCHERS), choices=LAUNCHERS)
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        turns((args.child[0], int(args.child[1])), "torchrun")
        return
    names = ["torchrun"] + [n for n in args.launchers if n != "torchrun"]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(HERE), os.environ.get("PYTHONPATH")) if p)
    if "hvd_magic-spark" in names:
        _Spark.get(args.np)
    coordinator, errors, loads = Coordinator(), [], [os.getloadavg()]
    rates = {name: [] for name in names}
    with scratch_runs("bench_ds_turns-") as run_root:
        threads = [start_world(name, args.np, coordinator, run_root, errors) for name in names]
        try:
            coordinator.wait_for(names)
            for name in names:  # (a turn each, untimed: the first after waiting)
                coordinator.turn(name, args.turn_steps)
            for _ in range(args.turns):
                for name in names:
                    rates[name].append(coordinator.turn(name, args.turn_steps))
            coordinator.turn("torchrun", args.turn_steps)  # (the last turn's "after")
            rates["torchrun"].append(coordinator.turn("torchrun", args.turn_steps))
        finally:
            coordinator.stop()
            for thread in threads:
                thread.join(timeout=120)
        loads.append(os.getloadavg())
    if errors:
        raise SystemExit("; ".join(errors))
    rows = []
    print(f"deepspeed-turns: rank 0's steps/s in {args.turns} turns of {args.turn_steps} steps, "
          f"np={args.np}; a turn's ratio: over the mean of the torchrun turns beside it")
    for name in names:
        ratios = paired(rates, name) if name != "torchrun" else [1.0]
        median = statistics.median(rates[name])
        print(f"  {name:17s} median {median:7.1f} steps/s, best {max(rates[name]):7.1f}; "
              f"paired ratio median {statistics.median(ratios):.3f} "
              f"(quartiles {statistics.quantiles(ratios, n=4)[0]:.3f}-"
              f"{statistics.quantiles(ratios, n=4)[2]:.3f})" if len(ratios) > 1 else
              f"  {name:17s} median {median:7.1f} steps/s, best {max(rates[name]):7.1f}")
        rows.append(dict(bench="deepspeed-turns", name=name, np=args.np, median=median,
                         best=max(rates[name]), ratio=statistics.median(ratios),
                         unit="steps/s", better="higher", reference="torchrun",
                         turns=args.turns, turn_steps=args.turn_steps, values=rates[name],
                         paired=ratios, loads=loads))
    print(f"load averages (1, 5, 15 min) before, after: {loads}")
    write(args.json, rows)


if __name__ == "__main__":
    main()
