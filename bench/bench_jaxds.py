"""DeepSpeed and JAX cells (#82): their throughput beside the same code started by hand, and the
first DeepSpeed run's wait for its C++ op.

- ``deepspeed-train``: rank 0's steps/s of ZeRO-2 training (a 256-512-10 MLP, a batch of 64 per
  rank, torch's SGD, Gloo), timed inside the rank between two barriers after a warm-up, under
  ``hvd_magic.run(train, np=-N)`` (``hvd_magic-driver``), ``np=N`` on Spark (``hvd_magic-spark``)
  and ``torchrun --nproc_per_node N`` running the same function (``torchrun``, the reference;
  ``DS_ACCELERATOR=cpu`` and the same op folder, warm).
- ``jax-psum``: rank 0's milliseconds per all-reduce of 4 MiB of float32 (a jit summing a global
  array over the processes, replicated out), median of the calls, under ``hvd_magic.run(...,
  np=-2)`` with a bare ``jax.distributed.initialize()`` and in two processes started by hand
  with ``initialize(address, 2, rank)`` (``by-hand``, the reference).
- ``deepspeed-first-run``: the wall seconds of a ``--np -2`` call whose ranks run
  ``deepspeed.init_distributed()``, with an empty op folder (``TORCH_EXTENSIONS_DIR`` a new
  one: the shared-memory op compiled) and with the host's folder, warm.

    .venv/bin/python bench/bench_jaxds.py [--np 2] [--reps 3] [--steps 200] [--cold-reps 1]
                                          [--json PATH]

Not a test: timings live here only.
"""

import argparse
import importlib.metadata
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench_ddp import hvd_magic_call, interleaved, show, torchrun_rate
from bench_launch import base_env, scratch_runs, spark_then
from rows import row, rows_against, write

HERE = os.path.abspath(__file__)
WARMUP = 10
PSUM_MIB, PSUM_CALLS = 4, 50
ZERO2 = {"train_micro_batch_size_per_gpu": 64, "gradient_clipping": 0.0,
         "zero_optimization": {"stage": 2}, "zero_allow_untested_optimizer": True}


def ds_train(steps, warmup=WARMUP, on_window=None):
    """Rank 0's steps/s of `steps` ZeRO-2 steps (every rank returns its own); `on_window("start")`
    and `("end")` called at the timed steps' edges (bench_dscpu.py measures its CPU there)."""
    import time

    import torch.distributed as dist

    train_step = ds_step()
    start = None
    for i in range(warmup + steps):
        if i == warmup:
            dist.barrier()
            if on_window:
                on_window("start")
            start = time.perf_counter()
        train_step()
    dist.barrier()
    rate = steps / (time.perf_counter() - start)
    if on_window:
        on_window("end")
    return rate


def ds_step():
    """One ZeRO-2 training step of the benchmark's model, as a function (DeepSpeed initialized
    here: a launched world of ranks)."""
    import deepspeed
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    engine, *_ = deepspeed.initialize(model=model, config=ZERO2,
                                      optimizer=torch.optim.SGD(model.parameters(), lr=0.01))
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step():
        engine.backward(torch.nn.functional.cross_entropy(engine(x), y))
        engine.step()
    return step


def jax_psum_ms(coordinator=None, process_id=None, mib=PSUM_MIB, calls=PSUM_CALLS):
    """Milliseconds per all-reduce of `mib` MiB over the processes (median of `calls`)."""
    import time

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    if coordinator is None:
        jax.distributed.initialize()
    else:
        jax.distributed.initialize(coordinator, 2, process_id)
    mesh = Mesh(np.array(jax.devices()), ("p",))
    local = np.ones((1, mib * 2**20 // 4), np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("p")), local)
    total = jax.jit(lambda a: jnp.sum(a, axis=0), out_shardings=NamedSharding(mesh, P()))
    total(x).block_until_ready()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        total(x).block_until_ready()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def extensions_env():
    """torchrun's workers see the op folder hvd_magic's ranks use, warm, and the CPU accelerator."""
    from hvd_magic.rank.deepspeed_setup import extensions_dir
    env = base_env()
    folder = os.path.dirname(importlib.util.find_spec("deepspeed").origin)
    env.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir(
        importlib.metadata.version("torch"), importlib.metadata.version("deepspeed"), folder))
    env.setdefault("DS_ACCELERATOR", "cpu")
    return env


def by_hand_psum(np):
    """Two processes started here, each initializing JAX with explicit arguments."""
    from hvd_magic.rank.sockets import reserve
    held = reserve()
    port = held.getsockname()[1]
    held.close()
    env = {**base_env(), "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, HERE, "--jax-child", str(r), str(port)], env=env,
                              stdout=subprocess.PIPE, text=True) for r in range(np)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a JAX process exited with {[p.returncode for p in procs]}")
    return float(next(line.split()[1] for line in outs[0].splitlines() if line.startswith("MS ")))


def child(kind, argv):
    if kind == "ds":
        rate = ds_train(int(argv[0]))
        if os.environ.get("RANK") == "0":
            print(f"RATE {rate}", flush=True)
    else:
        ms = jax_psum_ms(f"127.0.0.1:{argv[1]}", int(argv[0]))
        print(f"MS {ms}", flush=True)
    sys.stdout.flush()
    os._exit(0)


def init_distributed():
    import deepspeed
    deepspeed.init_distributed()
    return True


def first_run(run_root, cold):
    """Seconds of a --np -2 call running deepspeed.init_distributed(), its op folder empty or
    warm."""
    import hvd_magic
    from hvd_magic.view import TextView
    env = {"TORCH_EXTENSIONS_DIR": tempfile.mkdtemp(dir=run_root)} if cold else {}
    start = time.perf_counter()
    hvd_magic.run(init_distributed, np=-2, env=env, run_dir=tempfile.mkdtemp(dir=run_root),
                  view=TextView(quiet=True))
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, nargs="+", default=[2])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--cold-reps", type=int, default=1, help="first runs with an empty op "
                        "folder (each compiles for minutes)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--ds-child", nargs=1, help=argparse.SUPPRESS)
    parser.add_argument("--jax-child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ds_child or args.jax_child:
        return child("ds" if args.ds_child else "jax", args.ds_child or args.jax_child)

    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(HERE), os.environ.get("PYTHONPATH")) if p)
    max_np = max(args.np)
    loads = [os.getloadavg()]
    with scratch_runs("bench_jaxds-") as run_root:
        rates = interleaved({
            "torchrun": lambda np: torchrun_rate(np, args.steps, HERE, "--ds-child",
                                                 extensions_env()),
            "hvd_magic-driver":
                lambda np: hvd_magic_call(ds_train, -np, run_root, (args.steps,))[1],
            "hvd_magic-spark": spark_then(
                lambda np: hvd_magic_call(ds_train, np, run_root, (args.steps,))[1], max_np),
        }, args.np, args.reps, "deepspeed", lambda v: f"{v:8.1f} steps/s")
        loads.append(os.getloadavg())
        psums = interleaved({
            "by-hand": by_hand_psum,
            "hvd_magic-driver": lambda np: hvd_magic_call(jax_psum_ms, -np, run_root)[1],
        }, [2], args.reps, "jax", lambda v: f"{v:7.2f} ms")
        loads.append(os.getloadavg())
        warm = [first_run(run_root, cold=False) for _ in range(args.reps)]
        cold = [first_run(run_root, cold=True) for _ in range(args.cold_reps)]
        loads.append(os.getloadavg())
    show("deepspeed-train: rank 0's steps/s", rates, "torchrun", "steps/s")
    show("jax-psum: ms per 4 MiB all-reduce", psums, "by-hand", "ms")
    print(f"\ndeepspeed-first-run: warm {statistics.median(warm):.1f} s, empty op folder "
          + (f"{statistics.median(cold):.1f} s" if cold else "not measured (--cold-reps 0)"))
    print(f"load averages (1, 5, 15 min) before, between, after: {loads}")
    warm_median = statistics.median(warm)
    write(args.json,
          rows_against("deepspeed-train", rates, "torchrun", unit="steps/s", better="higher",
                       reps=args.reps, steps=args.steps, loads=loads)
          + rows_against("jax-psum", psums, "by-hand", unit="ms", reps=args.reps,
                         mib=PSUM_MIB, loads=loads)
          + [row("deepspeed-first-run", "warm-op-folder", 2, warm, ref=warm_median,
                 reference="warm-op-folder", loads=loads),
             row("deepspeed-first-run", "empty-op-folder", 2, cold, ref=warm_median,
                 reference="warm-op-folder", loads=loads)][:1 + bool(cold)])


if __name__ == "__main__":
    main()
