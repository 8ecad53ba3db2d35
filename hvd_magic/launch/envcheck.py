"""``%horovod_env``: do the executors have what the ranks need, in the driver's versions?

One short Spark barrier job with a task in every slot (so every executor is reached) runs `probe`
on the executors, and the driver runs it too. The report (`envreport`) puts them side by side, one row per
executor: Python, cloudpickle, torch, TensorFlow, horovod (built against which frameworks? with
Gloo? NCCL?), hvd_magic and pyspark versions, and the GPUs each executor sees (CUDA_VISIBLE_DEVICES, torch's device count, the GPU
addresses Spark assigns its tasks). Every value that differs from the driver's is a `Mismatch`.

`probe` must run where hvd_magic is not installed (that is one of the things it finds out), so it
is sent by value: `_portable` gives a copy of it that belongs to no module, and PySpark's cloudpickle
then ships its code instead of a reference to ``hvd_magic.launch.envcheck``. It imports everything it uses
in its body and reports a package it cannot import as "missing" instead of failing.

Not for: launching ranks (`hvd_magic.launch.spark`), fixing environments, or anything a run needs: it is
a diagnosis a person runs when the ranks fail to start or to unpickle the cell.
"""

import builtins
import re
import types
import uuid

from .envreport import PICKLE_ADVICE, EnvReport, compare, env_row, template_notes


def probe(_partition=()):
    """What this interpreter has: package versions and GPUs, as a one-item list of a dict.

    A list, so that it can be given to ``mapPartitions`` as it is. Standard library only, and
    imports inside the body: see the module docstring. Inside a Spark task it also records the
    task's GPU addresses and (in a barrier task) its executor's address.
    """
    import os
    import socket
    import sys

    values = {"python": sys.version.split()[0]}
    for name in ("cloudpickle", "torch", "horovod", "hvd_magic", "pyspark"):
        try:
            module = __import__(name)
            values[name] = str(getattr(module, "__version__", "unknown"))
        except ModuleNotFoundError as exc:
            # a missing dependency of an installed package is not the package missing
            values[name] = "missing" if exc.name == name else f"broken ({exc})"[:120]
        except Exception as exc:  # a package whose import fails can fail in any way
            values[name] = f"broken ({type(exc).__name__}: {exc})"[:120]
    import ast
    import importlib.metadata as metadata
    tf = [d.version for d in metadata.distributions()
          if d.metadata["Name"].lower().replace("_", "-") in ("tensorflow-cpu", "tensorflow")]
    values["tensorflow"] = tf[0] if tf else "missing"  # metadata: importing TF takes seconds
    # What Horovod's compiled parts fit (hvd_magic.build_horovod records it): those versions only.
    values["horovod_built"] = ""
    for folder in getattr(sys.modules.get("horovod"), "__path__", ()):
        try:
            with open(os.path.join(folder, "_hvd_magic_build.py")) as f:
                built = ast.literal_eval(f.read().split("=", 1)[1].strip())
            values["horovod_built"] = ", ".join(f"{k} {v}" for k, v in built.items() if v)
        except (OSError, SyntaxError, IndexError, ValueError):
            values["horovod_built"] = "not recorded"
    values["horovod_gloo"] = values["horovod_nccl"] = ""
    if not values["horovod"].startswith(("missing", "broken")):
        try:
            import horovod.torch as hvd
            values["horovod_gloo"] = "yes" if hvd.gloo_built() else "no"
            values["horovod_nccl"] = "yes" if hvd.nccl_built() else "no"
        except Exception as exc:  # e.g. built against another torch: an undefined symbol
            values["horovod_gloo"] = values["horovod_nccl"] = \
                f"horovod.torch fails ({type(exc).__name__}: {exc})"[:120]
    values["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
    torch = sys.modules.get("torch")
    try:
        values["cuda_device_count"] = str(torch.cuda.device_count()) if torch else ""
    except Exception as exc:
        values["cuda_device_count"] = f"error ({exc})"[:120]

    try:  # what Gloo falls back to where HOROVOD_GLOO_IFACE is not used (see compare)
        values["hostname_address"] = socket.gethostbyname(socket.gethostname())
    except OSError as exc:
        values["hostname_address"] = f"unresolved ({exc})"[:120]

    info = {"hostname": socket.gethostname(), "executable": sys.executable, "pid": os.getpid(),
            "executor": None, "spark_gpus": [], "values": values, "template": None}
    try:  # the template ranks are forked from here (hvd_magic.template), if one runs
        from hvd_magic.task.environ import rank_base_env
        from hvd_magic.template import client
        info["template"] = client.status(rank_base_env())
    except Exception:  # an executor without hvd_magic, or an older one
        pass
    try:
        from pyspark import BarrierTaskContext, TaskContext
        ctx = TaskContext.get()
    except ImportError:
        ctx = None
    if ctx is not None:
        gpu = ctx.resources().get("gpu")
        info["spark_gpus"] = list(gpu.addresses) if gpu is not None else []
        if isinstance(ctx, BarrierTaskContext):
            info["executor"] = ctx.getTaskInfos()[ctx.partitionId()].address
    return [info]


def _portable(fn):
    """A copy of `fn` whose globals are not a module's, so cloudpickle pickles its code by value.

    cloudpickle pickles a function by reference when it finds it in an importable module; this
    copy is in none, so the executor needs nothing of ours to run it.
    """
    return types.FunctionType(fn.__code__, {"__builtins__": builtins}, fn.__name__,
                              fn.__defaults__)


# --- running the probe --------------------------------------------------------------------------

def _context(spark):
    if spark is not None:
        return getattr(spark, "sparkContext", spark)  # a SparkSession or a SparkContext
    from ..compat import pyspark as pyspark_compat
    return pyspark_compat.active_context()


def _slots(sc):
    from .spark import cluster_slots, local_slots
    slots = local_slots(sc.master)
    return slots if slots is not None else cluster_slots(sc)


def _registered_executors(sc):
    """Executors the driver knows of (the driver itself excluded, local mode counts as one)."""
    if sc.master.startswith("local"):
        return 1
    return len(sc.statusTracker().getExecutorInfos()) - 1


def _spark_error(exc):
    """The Python error an executor raised, else the first line of what Spark said."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    python = re.findall(r"^\s*((?:[\w.]+\.)?\w+(?:Error|Exception): .*)$", text, re.M)
    python = [line for line in python if not line.startswith(("org.apache", "java.", "py4j"))]
    if python:
        return python[-1].strip()
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _run_probes(sc, tasks, timeout):
    """Probe results from a barrier job of `tasks` tasks; (results, error message)."""
    group = f"hvd_magic-envcheck-{uuid.uuid4().hex[:8]}"
    outcome = {}

    def collect():
        try:
            sc.setJobGroup(group, "hvd_magic %horovod_env", interruptOnCancel=True)
            rdd = sc.parallelize(range(tasks), tasks).barrier().mapPartitions(_portable(probe))
            outcome["results"] = rdd.collect()
        except Exception as exc:  # reported in the report, never lost
            outcome["error"] = exc
        finally:
            sc.setLocalProperty("spark.jobGroup.id", None)

    from pyspark import InheritableThread
    thread = InheritableThread(target=collect, name="hvd-magic-envcheck", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        sc.cancelJobGroup(group)
        thread.join(30)
        return [], (f"the probe job did not finish within {timeout:g} s (it needs all {tasks} "
                    f"task slots at once: is another job running?)")
    if "error" in outcome:
        return [], _spark_error(outcome["error"])
    return outcome["results"], None


def check(spark=None, timeout=120.0):
    """Compare every executor's packages and GPUs with the driver's; return an `EnvReport`.

    `spark` is a SparkSession or SparkContext (default: the active one). Without one, only the
    driver is reported (``%%horovod --np N`` would then start a local session on this machine).
    """
    here = probe()
    driver = env_row("driver", here)
    sc = _context(spark)
    if sc is None:
        return EnvReport(master="no SparkSession", driver=driver, notes=template_notes([("driver", here)]) + [
            "No active SparkSession: %%horovod --np N would start an embedded local[N] session "
            "on this machine, whose executors are this Python. Start your session first to check "
            "its executors."])
    # A task in every slot reaches every executor. Executors that registered while the job was
    # being scheduled (a session that has just started) are caught by a second round.
    for _ in range(3):
        tasks = _slots(sc)
        if tasks < 1:
            return EnvReport(master=sc.master, driver=driver,
                             error="the cluster has no task slots (no executor has registered yet)")
        results, error = _run_probes(sc, tasks, timeout)
        by_executor = {}
        for info in results:
            by_executor.setdefault(info["executor"] or info["hostname"], []).append(info)
        registered = _registered_executors(sc)
        if error or len(by_executor) >= registered:
            break
    executors = [env_row(where, infos) for where, infos in sorted(by_executor.items())]
    mismatches, notes = compare(driver, executors)
    notes += template_notes([("driver", here)] + sorted(by_executor.items()))
    if error and "PYTHON_VERSION_MISMATCH" in error:
        notes.insert(0, PICKLE_ADVICE)
    if not error and len(executors) < registered:
        notes.append(f"{registered} executors are registered but only {len(executors)} ran the "
                     "probe (some joined after it started?); run it again to see them all.")
    return EnvReport(master=sc.master, driver=driver, executors=executors, mismatches=mismatches,
                     notes=notes, error=error)


if __name__ == "__main__":  # python -m hvd_magic.launch.envcheck: this interpreter's row, as JSON
    import json
    print(json.dumps(probe()[0], indent=1))
