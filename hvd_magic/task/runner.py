"""What one task does: the same code runs inside a Spark barrier task and in a driver-only thread.

1. Hosts are the executors' addresses as the cluster knows them (`Coordinator.task_address`);
   every task derives the same slot plan from them, and its own slot (rank, local rank...).
2. Task 0 serves what each framework's rendezvous needs (`hvd_magic.frameworks`: Horovod's Gloo
   rendezvous server...), every task reserves what its own rank needs (TensorFlow's port); the
   driver gathers them and relays them to every task over the event channel (no Spark barrier
   sync, which costs about a second each).
3. Each task connects to the driver's event server (see `DriverLink`).
4. It starts the rank (``python -m hvd_magic.rank``, or forked from this host's template:
   `hvd_magic.task.spawn`) in its own process group, with every framework's environment set explicitly, and forwards the rank's stdout, stderr and structured
   events to the driver's event server, labelled by rank.
5. It returns ``(rank, status, payload)``: the rank's pickled value, or its error summary.

A ``stop`` message from the driver (cancel, timeout, another rank failed) ends the rank's process
group: SIGTERM, a short grace, then SIGKILL.

Not for: IPython, widgets or anything the notebook shows. Settings travel as one small picklable
`TaskSettings`; the cell's function and values travel as bytes that only the rank unpickles.
"""

import json
import os
import shutil
import signal
import socket
import tempfile
import threading

from .. import frameworks, payload
from ..cleanup import Cleanup
from .shipped import arrive, spark_fetched
from ..rank.session import FRAMEWORK_VARS
from .environ import rank_base_env
from .gpus import VIEW as GPU_VIEW, GpuLayout, layout as gpu_layout, task_gpus
from .link import DriverLink, FileStream, send_folder
from .plan import _resolve, host_plan
from .resources import Sampler
from .session import SessionRank
from .stacks import StackProbe
from .settings import Coordinator, SparkCoordinator, TaskSettings
from .spawn import start_rank
from .stopping import ended_by, kill_group, stop_group
from .threads import rank_threads, thread_env


def spark_task(settings, _iterator):
    """The function of the barrier stage (module level, so it pickles by reference)."""
    yield run_task(settings, SparkCoordinator())


def run_task(settings: TaskSettings, coord: Coordinator, make_link=None):
    """Run this task's rank to its end; its ``(rank, status, payload)``. `make_link(rank)`: the
    link to the driver (default: a `DriverLink` of its own)."""
    if coord.attempt > 0 and not settings.allow_retry:
        return (None, "retried", {
            "partition": coord.partition_id, "attempt": coord.attempt,
            "message": "Spark re-attempted the barrier stage after a failure; hvd_magic refuses to "
                       "start training over silently (pass --retries N to allow it)."})

    # Hosts as the cluster knows the executors: tasks of one executor host share local ranks.
    # Every task computes the same plan from them, so no task needs to hear from another.
    hosts = [coord.task_address(i) for i in range(settings.np)]
    plan, slots = host_plan(hosts)
    slot = slots[coord.partition_id]
    host = socket.gethostname()
    link = make_link(slot.rank) if make_link is not None else DriverLink(settings, slot.rank)
    refused = unshippable(settings, link, slot.rank, host)
    if refused is not None:  # before any rank starts: no rendezvous is relayed without this task
        link.close()
        return refused
    serving = None
    # Spark's GPU addresses and this executor's own list: read once the executor's other tasks
    # said theirs (task/gpus.py: one reading per executor)
    spark_gpus = {"spark": [] if "CUDA_VISIBLE_DEVICES" in settings.extra_env  # env= chose
                  else coord.gpus(),  # (TorchDistributor's use_gpu=False: none), as --env wins
                  "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        # Task 0 serves every framework's rendezvous, every task reserves its own (TensorFlow's
        # port, and says its GPUs); the driver gathers them and relays them to every task over
        # the event channel (milliseconds, where a Spark barrier sync takes ~1 s).
        serving = frameworks.Serving(slot, first=coord.partition_id == 0, gpus=spark_gpus)
        link.forward.send(serving.message)
        timeout = float(settings.horovod_env.get("HOROVOD_GLOO_TIMEOUT_SECONDS", 300))
        relayed = link.wait_rendezvous(timeout)
        if relayed is None:
            link.forward.send({"t": "exit", "code": None, "status": "stopped", "summary": None})
            return (slot.rank, "stopped", {"rank": slot.rank, "host": host, "code": None})
        world = frameworks.World(settings.np, tuple(hosts), settings.run_id, _resolve(hosts[0]))
        executors = [coord.executor_of(i) for i in range(settings.np)]
        said = dict(enumerate((relayed.get("gpus") or {}).get("tasks") or ()))
        by_rank = task_gpus(said, {s.rank: e for s, e in zip(slots, executors)})
        here = [s.rank for s in sorted(plan, key=lambda s: s.local_rank)
                if s.hostname == slot.hostname]
        gpus = gpu_layout(by_rank, here, slot.rank)
        env = rank_env(settings, frameworks.rank_env(slot, world, relayed),
                       gpus, slot.local_size, executors.count(coord.executor()))
        outcome = _run_rank(settings, slot, env, host, gpus, link, executor=coord.executor(),
                            partition=coord.partition_id)
        return outcome
    finally:
        link.close()
        if serving is not None:
            serving.stop()


def unshippable(settings, link, rank, host):
    """The outcome of a task whose executor cannot use what the notebook shipped (a compiled
    package built for another Python: `shipped.arrive`), said to the driver; None where it can."""
    if not settings.shipment:
        return None
    refused = arrive(settings.shipment, spark_fetched)[1]
    if not refused:
        return None
    info = {"rank": rank, "host": host, "code": None, "type": "CannotShip",
            "message": "\n".join(refused)}
    link.forward.send({"t": "exit", "code": None, "status": "error", "summary": info})
    return (rank, "error", info)


def rank_env(settings, slot_vars, gpus, ranks_on_host, ranks_on_executor=None):
    """The whole environment of a rank process: its task's (less what only a Spark worker needs:
    environ.py), its share of the host's cores (threads.py), the driver's Horovod knobs, ``--env``
    (which wins over both), its slot's variables (every framework's: `hvd_magic.frameworks`) and
    its GPUs (a `GpuLayout`: task/gpus.py)."""
    env = rank_base_env()
    if settings.shipment:  # the notebook's packages this executor lacks, first on the path
        folders = arrive(settings.shipment, spark_fetched)[0]
        env["PYTHONPATH"] = os.pathsep.join(folders + [p for p in [env.get("PYTHONPATH")] if p])
    threads = rank_threads(ranks_on_host, settings.executor_cores, ranks_on_executor)
    env.update(thread_env(threads, settings.extra_env))
    env.update(settings.horovod_env)
    env.update(settings.extra_env)
    env.update({k: str(v) for k, v in slot_vars.items()})
    # which of them are the frameworks': a warm session's rank puts back any a cell removed
    env[FRAMEWORK_VARS] = ",".join(sorted(slot_vars))
    env.update(gpus.env(settings.extra_env.get(GPU_VIEW, "shared")))
    return env


def run_worker(settings, slot, env, executor=None, partition=None, on_link=None, link=None,
               gpus=(), ranks_on_host=1):
    """One rank process for a launcher that plans the ranks itself (Horovod's elastic driver:
    `hvd_magic.launch.elastic.launcher`): `env` holds its Horovod variables, `slot.rank` labels its events
    (the view's row), `ranks_on_host` share this host's cores (every slot the launcher may fill
    there, not only the current ring's). `on_link(link)` is called once the driver link is up; a `link` given is used
    (and left open). Its outcome."""
    own = link is None
    if own:
        link = DriverLink(settings, slot.rank)
    try:
        if on_link is not None:
            on_link(link)
        gpus = GpuLayout(tuple(gpus), tuple(gpus), ())  # (a slot's GPUs: its own, all of them)
        full = rank_env(settings, env, gpus, ranks_on_host)
        return _run_rank(settings, slot, full, socket.gethostname(), gpus, link,
                         executor=executor, partition=partition)
    finally:
        if own:
            link.close()


def _write_job(workdir, settings):
    """The job file for the rank: small values inline, large ones as where the rank reads them."""
    import pickle
    job = pickle.loads(settings.job)
    for name, ref in settings.broadcast_kwargs.items():
        job["kwargs"][name] = payload.for_rank(ref)  # the executor's one file, not a copy per rank
    with open(os.path.join(workdir, "job.pkl"), "wb") as f:
        pickle.dump(job, f, protocol=pickle.HIGHEST_PROTOCOL)


def _run_rank(settings, slot, env, host, gpus, link, executor=None, partition=None):
    rank = slot.rank
    forward = link.forward
    workdir = tempfile.mkdtemp(prefix=f"hvd_magic-{settings.run_id}-rank{rank}-")
    cleanup = Cleanup.here()  # the folder goes even if this process is SIGKILLed
    cleanup.keep(workdir)
    proc = None
    try:
        if settings.session:
            SessionRank(link, settings.token)  # takes cells from the driver for this rank
        else:
            _write_job(workdir, settings)
        events_r, events_w = os.pipe()
        env["HVD_MAGIC_EVENT_FD"] = str(events_w)
        probe_r, probe_w = os.pipe()  # stacks requests to the rank (task/stacks.py)
        env["HVD_MAGIC_PROBE_FD"] = str(probe_r)
        env["HVD_MAGIC_STACKS_FILE"] = dump_path = os.path.join(workdir, "stacks.dump")
        env["HVD_MAGIC_PARENT_PID"] = str(os.getpid())
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"
        timeline_path = os.path.join(workdir, "timeline.json")
        env["HVD_MAGIC_TIMELINE_PATH"] = timeline_path
        tensorboard = env["HVD_MAGIC_TENSORBOARD_DIR"] = os.path.join(workdir, "tensorboard")
        # torch's `record` writes a failing rank's error there (torchrun gives each worker one)
        torch_errors = os.path.join(workdir, "torchelastic")
        os.makedirs(torch_errors)
        env.setdefault("TORCHELASTIC_ERROR_FILE", os.path.join(torch_errors, "error.json"))
        # The rank's temporary files go with its folder: a rank skips interpreter teardown, so the
        # atexit clean-ups of what libraries leave in /tmp (TensorFlow's autograph writes a file
        # per converted function) never run. `--env TMPDIR=...` wins, and so does a deep task
        # folder: multiprocessing's sockets go under TMPDIR (torch's DataLoader workers pass
        # tensors through them), and a socket's path is at most 107 bytes.
        tmp = os.path.join(workdir, "tmp")
        if "TMPDIR" not in settings.extra_env and len(tmp) <= 70:
            os.makedirs(tmp)
            env["TMPDIR"] = tmp
        # A full timeline when asked for; DYNAMIC when the job may record a window with
        # `hvd_magic.timeline()` (it costs every rank each cycle: driver/run.py).
        if settings.timeline or settings.timeline_window:
            env.setdefault("HOROVOD_TIMELINE", timeline_path if settings.timeline else "DYNAMIC")
        profiled = os.path.join(workdir, "profile")  # torch's profile of a few steps (rank/profile.py)
        if settings.profile:
            env["HVD_MAGIC_PROFILE"] = json.dumps(dict(settings.profile,
                                                       path=os.path.join(profiled, "trace.json")))
        cwd = settings.cwd if settings.cwd and os.path.isdir(settings.cwd) else workdir
        proc = link.proc = start_rank(
            settings, ["hvd_magic.rank", workdir] + (["--session"] if settings.session else []),
            env, cwd, {"HVD_MAGIC_EVENT_FD": events_w, "HVD_MAGIC_PROBE_FD": probe_r})
        cleanup.keep(workdir, proc.pid)  # (not while the rank may still write there)
        os.close(events_w)
        os.close(probe_r)
        link.probe = StackProbe(proc, probe_w, dump_path, forward)
        forward.on_stacks = link.probe.answer
        if link.stopping.is_set():  # the stop came while the rank was being started
            link.stop_rank()
        forward.send({"t": "state", "state": "starting", "host": host, "pid": proc.pid,
                      "local_rank": slot.local_rank, "gpus": list(gpus.own),
                      "gpu_index": list(gpus.indices), "executor": executor,
                      "partition": partition, "threads": env.get("OMP_NUM_THREADS")})
        sampler = Sampler(proc.pid, forward.send, gpus.own)  # its CPU, memory and GPUs, each second
        if os.environ.get("HVD_MAGIC_NO_RESOURCES") != "1":  # (a switch for bench/ only)
            sampler.start()
        # Rank 0's timeline streams to the driver as it is written (nothing lost if the notebook dies).
        timeline = FileStream(forward, timeline_path, "timeline") if rank == 0 else None
        with os.fdopen(events_r, "rb") as events_pipe:
            pumps = [
                threading.Thread(target=forward.pump_lines, args=(proc.stdout, "stdout"), daemon=True),
                threading.Thread(target=forward.pump_lines, args=(proc.stderr, "stderr"), daemon=True),
                threading.Thread(target=forward.pump_events, args=(events_pipe,), daemon=True),
            ]
            if timeline is not None:
                pumps.append(threading.Thread(target=timeline.follow, daemon=True))
            for p in pumps:
                p.start()
            code = proc.wait()
            sampler.stop()
            link.probe.close()
            kill_group(proc.pid)  # whatever the rank left running (its session) goes with it
            if timeline is not None:
                timeline.close()  # the rest of rank 0's timeline, whatever happened
            for p in pumps:
                p.join(timeout=10)
        send_folder(forward, tensorboard, "tensorboard")  # what the rank logged, whatever happened
        if code != 0:
            send_folder(forward, torch_errors, "torchelastic")
        send_folder(forward, profiled, "profile")
        # stopped: by the stop's own signals (a rank that killed itself as the stop came died)
        outcome = _outcome(workdir, code, rank, host, ended_by(code, link.signalled), env, sampler)
        forward.send({"t": "exit", "code": code, "status": outcome[1],
                      "summary": outcome[2] if outcome[1] != "ok" else None})
        return outcome
    finally:
        if proc is not None:
            stop_group(proc, grace=0.5)
        shutil.rmtree(workdir, ignore_errors=True)
        cleanup.forget(workdir)


def _outcome(workdir, code, rank, host, stopped, env, sampler=None):
    result_path = os.path.join(workdir, "result.pkl")
    error_path = os.path.join(workdir, "error.json")
    if code == 0 and os.path.exists(result_path):
        with open(result_path, "rb") as f:
            return (rank, "ok", f.read())
    info = {"rank": rank, "host": host, "code": code}
    if "HOROVOD_GLOO_RENDEZVOUS_ADDR" in env:  # (Horovod's, where it is installed: frameworks/)
        info.update(rendezvous="{HOROVOD_GLOO_RENDEZVOUS_ADDR}:{HOROVOD_GLOO_RENDEZVOUS_PORT}"
                    .format(**env), iface=env["HOROVOD_GLOO_IFACE"])
    if os.path.exists(error_path):
        with open(error_path) as f:
            info.update(json.load(f))
        return (rank, "error", info)
    if stopped:
        return (rank, "stopped", info)
    if code < 0:
        info["signal"] = signal.Signals(-code).name
    if code == -signal.SIGKILL and sampler is not None:
        oom = sampler.oom()  # the kernel's OOM killer: the run names it
        if oom is not None:
            info["oom"] = oom
    return (rank, "died", info)
