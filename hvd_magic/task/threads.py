"""How many CPU threads a rank's libraries may start: its share of the cores its host has for
ranks, set in the rank's environment before its code runs.

Left alone, torch, numpy's BLAS and TensorFlow each size their pools to every core of the machine:
two ranks on two cores then run four busy threads and lose almost half their speed (horovodrun
does the same; bench/bench_threads.py). PySpark's workers, for their part, set
``OMP_NUM_THREADS`` to ``spark.task.cpus`` (1 by default), which leaves 14 cores of a 16-core
executor idle under two ranks. A rank gets instead the cores its host (or executor) has for
ranks divided by the ranks there, at least 1.

An explicit ``--env OMP_NUM_THREADS=n`` is every library's count; any other of `THREAD_VARS`
given with ``--env`` wins for its own library; a cell that sets them before its imports, or calls
``torch.set_num_threads``, runs after all this and wins too.

Not for: a framework's other settings. The share is framework-neutral: it is a number of cores,
written into the variables each library reads.
"""

import math
import os
import re

# What the libraries on a rank read at start-up to size their pools: OpenMP (torch's intra-op
# threads, numpy's BLAS where built with OpenMP), MKL, OpenBLAS (numpy's wheels), BLIS, Apple's
# Accelerate, numexpr (pandas), TensorFlow's intra- and inter-op pools.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "BLIS_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
               "TF_NUM_INTEROP_THREADS")


def usable_cores():
    """The cores this process may run on: its CPU affinity, less a cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # (macOS, Windows: no affinity)
        cores = os.cpu_count() or 1
    quota = _cgroup_cores()
    return max(1, min(cores, quota) if quota else cores)


def _cgroup_cores():
    """A container's CPU limit in cores (cgroup v2 ``cpu.max``, or v1's CFS quota), rounded up as
    the JVM does; None without one or where it cannot be read."""
    for path, read in (("/sys/fs/cgroup/cpu.max", lambda t: t.split()[:2]),
                       ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", None)):
        try:
            with open(path) as f:
                text = f.read()
            if read is not None:
                quota, period = read(text)
            else:
                quota = text.strip()
                with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
                    period = f.read().strip()
            if quota in ("max", "-1"):
                return None
            return max(1, math.ceil(int(quota) / int(period)))
        except (OSError, ValueError):
            continue
    return None


def executor_cores(master, conf_get):
    """The cores one Spark executor has for tasks, read on the driver from the session's master
    and settings; None where an executor has its host's cores (it may use all of them).

    - ``local[N]``: N. It is how many cores the user gave Spark, which runs N tasks at once on
      them; more than the machine has is capped later by the host's usable cores (our embedded
      session asks for at least 4 slots, and 4 ranks on 2 cores still share 2 cores), and
      ``local[*]`` is the machine itself;
    - ``local-cluster[n, c, m]``: c; elsewhere ``spark.executor.cores`` when set;
    - unset on YARN and Kubernetes: 1, their default; on a standalone cluster an executor takes
      all of its worker's cores: None.
    """
    master = master or ""
    if master == "local":
        return 1
    local = re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master)
    if local:
        return None if local.group(1) == "*" else int(local.group(1))
    cluster = re.fullmatch(r"local-cluster\[\s*\d+\s*,\s*(\d+)\s*,\s*\d+\s*\]", master)
    if cluster:
        return int(cluster.group(1))
    declared = conf_get("spark.executor.cores")
    if declared:
        return int(declared)
    return 1 if master.startswith(("yarn", "k8s")) else None


def rank_threads(ranks_on_host, executor_cores=None, ranks_on_executor=None, cores=None):
    """A rank's share: the host's usable cores (`cores`, default this machine's) over the ranks
    on the host, and no more than its executor's cores over the ranks on that executor (an
    executor of 4 cores on a 16-core host: its 2 ranks get 2 each); at least 1."""
    share = (usable_cores() if cores is None else cores) // max(1, ranks_on_host)
    if executor_cores:
        share = min(share, executor_cores // max(1, ranks_on_executor or ranks_on_host))
    return max(1, share)


def thread_env(threads, asked=None):
    """The variables that give a rank `threads` threads in every library; `asked` (the run's
    ``--env``) may name ``OMP_NUM_THREADS``, which then counts for every library."""
    explicit = str((asked or {}).get("OMP_NUM_THREADS", "")).strip()
    count = explicit if explicit.isdigit() and int(explicit) > 0 else str(threads)
    return {name: count for name in THREAD_VARS}
