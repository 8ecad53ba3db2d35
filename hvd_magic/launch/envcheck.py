"""``%horovod_env``: do the executors have what the ranks need, in the driver's versions?

One short Spark barrier job with a task in every slot (so every executor is reached) runs `probe`
on the executors, and the driver runs it too. The report puts them side by side, one row per
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
import dataclasses
import html
import re
import types
import uuid

from ..rank import buildcheck

MISSING = "missing"

# (field, column title): the report's columns, in order.
COLUMNS = [
    ("python", "Python"),
    ("cloudpickle", "cloudpickle"),
    ("torch", "torch"),
    ("tensorflow", "TensorFlow"),
    ("horovod", "horovod"),
    ("horovod_built", "Horovod built with"),
    ("horovod_gloo", "Gloo"),
    ("horovod_nccl", "NCCL"),
    ("hvd_magic", "hvd_magic"),
    ("pyspark", "pyspark"),
    ("cuda_visible_devices", "CUDA_VISIBLE_DEVICES"),
    ("cuda_device_count", "torch GPUs"),
    ("spark_gpus", "Spark GPUs"),
    ("hostname_address", "hostname resolves to"),
]
# Fields an executor should share with the driver. GPUs are shown, not compared: the driver of a
# GPU cluster usually has none.
COMPARED = ("python", "cloudpickle", "torch", "tensorflow", "horovod", "horovod_built",
            "horovod_gloo", "horovod_nccl", "hvd_magic", "pyspark")
# What a rank imports on its executor: without one of these `%%horovod` cannot start there.
NEEDED = ("torch", "horovod", "hvd_magic", "cloudpickle")
PACKAGES = ("cloudpickle", "torch", "horovod", "hvd_magic", "pyspark")

PICKLE_ADVICE = (
    "Python or cloudpickle versions that differ between the driver and the executors are the "
    "commonest cause of a cell that unpickles on the driver but not on the workers: the cell's "
    "function is pickled by the driver's cloudpickle and unpickled by the executor's. Install the "
    "driver's versions on the executors (or point PYSPARK_PYTHON at an environment that has "
    "them).")


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
    # What Horovod's compiled parts fit (scripts/build_horovod.sh records it): those versions only.
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
            "executor": None, "spark_gpus": [], "values": values}
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


# --- the report ---------------------------------------------------------------------------------

@dataclasses.dataclass
class EnvRow:
    """One place ranks may run: the driver, or one executor."""
    where: str                  # "driver", or the executor's address as Spark knows it (host:port)
    hostname: str
    executable: str
    values: dict                # field -> text, for the fields of COLUMNS
    tasks: int = 1              # probe tasks that ran on it


@dataclasses.dataclass
class Mismatch:
    """An executor's value that is not the driver's."""
    where: str
    what: str
    value: str
    driver: str

    def __str__(self):
        return f"{self.where}: {self.what} {self.value or '-'} (driver: {self.driver or '-'})"


@dataclasses.dataclass
class EnvReport:
    """What `check` found. Shown as an HTML table in a notebook and as text elsewhere."""
    master: str
    driver: EnvRow
    executors: list = dataclasses.field(default_factory=list)
    mismatches: list = dataclasses.field(default_factory=list)
    notes: list = dataclasses.field(default_factory=list)
    error: str = None           # the probe job failed or never ran (the rows are then incomplete)

    @property
    def rows(self):
        return [self.driver] + list(self.executors)

    def is_mismatch(self, row, field):
        return any(m.where == row.where and m.what == field for m in self.mismatches)

    def text(self):
        titles = ["where", "host"] + [title for _, title in COLUMNS]
        table = [titles]
        for row in self.rows:
            cells = [row.where, row.hostname]
            for field, _ in COLUMNS:
                value = row.values.get(field, "") or "-"
                cells.append(value + (" !" if self.is_mismatch(row, field) else ""))
            table.append(cells)
        widths = [max(len(r[i]) for r in table) for i in range(len(titles))]
        lines = [f"Environment of the driver and the executors ({self.master})"]
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
        if self.mismatches:
            lines.append(f"{len(self.mismatches)} mismatch"
                         f"{'es' if len(self.mismatches) != 1 else ''} with the driver (marked !):")
            lines += [f"  {m}" for m in self.mismatches]
        elif self.executors:
            lines.append("Every executor matches the driver.")
        if self.error:
            lines.append(f"The probe job failed: {self.error}")
        lines += self.notes
        return "\n".join(lines)

    def __str__(self):
        return self.text()

    def __repr__(self):
        return (f"<EnvReport {self.master}: {len(self.executors)} executors, "
                f"{len(self.mismatches)} mismatches>")

    def _repr_pretty_(self, printer, cycle):
        printer.text(self.text())

    def _repr_html_(self):
        esc = html.escape
        head = "".join(f"<th>{esc(t)}</th>" for t in ["where", "host"] + [t for _, t in COLUMNS])
        body = []
        for row in self.rows:
            cells = [f"<td><b>{esc(row.where)}</b></td>",
                     f"<td title='{esc(row.executable)}'>{esc(row.hostname)}</td>"]
            for field, _ in COLUMNS:
                value = row.values.get(field, "") or "-"
                if self.is_mismatch(row, field):
                    cells.append(f"<td style='background:#f8d0d0;font-weight:bold' title='driver: "
                                 f"{esc(self.driver.values.get(field, '') or '-')}'>{esc(value)}</td>")
                else:
                    cells.append(f"<td>{esc(value)}</td>")
            body.append("<tr>" + "".join(cells) + "</tr>")
        parts = [f"<p>Environment of the driver and the executors (<code>{esc(self.master)}"
                 f"</code>)</p>",
                 f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"]
        if self.mismatches:
            parts.append(f"<p style='color:#a00'>{len(self.mismatches)} mismatch"
                         f"{'es' if len(self.mismatches) != 1 else ''} with the driver:</p><ul>"
                         + "".join(f"<li>{esc(str(m))}</li>" for m in self.mismatches) + "</ul>")
        elif self.executors:
            parts.append("<p>Every executor matches the driver.</p>")
        if self.error:
            parts.append(f"<p style='color:#a00'>The probe job failed: {esc(self.error)}</p>")
        parts += [f"<p>{esc(note)}</p>" for note in self.notes]
        return "\n".join(parts)


def _row(where, infos):
    """One row from the probe results of the tasks that ran in one place."""
    first = infos[0]
    values = dict(first["values"])
    gpus = sorted({g for info in infos for g in info["spark_gpus"]}, key=lambda g: (len(g), g))
    values["spark_gpus"] = ",".join(gpus) if where != "driver" else ""
    return EnvRow(where=where, hostname=first["hostname"], executable=first["executable"],
                  values=values, tasks=len(infos))


def _differs(field, value, driver):
    if value == driver:
        return False
    # the Gloo/NCCL flags of a horovod missing on one side: the horovod column already says so
    return not (field.startswith("horovod_") and not (value and driver))


def compare(driver, executors):
    """Mismatches of each executor with the driver, and notes that say what they mean."""
    mismatches = [Mismatch(row.where, field, row.values.get(field, ""), driver.values.get(field, ""))
                  for row in executors for field in COMPARED
                  if _differs(field, row.values.get(field, ""), driver.values.get(field, ""))]
    notes = [f"{row.where}: {note}" for row in [driver] + list(executors)
             for note in buildcheck.stale_build(row.values)]
    if any(m.what in ("python", "cloudpickle") for m in mismatches):
        notes.append(PICKLE_ADVICE)
    lacking = {}
    for row in executors:
        for name in NEEDED:
            if row.values.get(name, MISSING).startswith(("missing", "broken")):
                lacking.setdefault(name, []).append(row.where)
    for name, places in lacking.items():
        notes.append(f"%%horovod needs {name} on every executor; it is missing or broken on "
                     f"{', '.join(places)}.")
    for row in executors:
        host = row.where.rsplit(":", 1)[0]
        if row.values.get("hostname_address", "").startswith("127.") and \
                not host.startswith("127.") and host != "localhost":
            notes.append(
                f"{row.where}: this executor's hostname resolves to "
                f"{row.values['hostname_address']}. Stock Horovod 0.28.1 binds one of its Gloo "
                f"contexts (the process set's) to that address whatever HOROVOD_GLOO_IFACE says, "
                f"so ranks on other hosts cannot connect to it: hvd.init() aborts. Use a Horovod "
                f"built by scripts/build_horovod.sh (it carries the fix) or make the hostname "
                f"resolve to a routable address.")
        if row.values.get("spark_gpus") and row.values.get("cuda_device_count") == "0":
            notes.append(f"{row.where}: Spark assigns its tasks GPUs {row.values['spark_gpus']} "
                         f"but torch sees no GPU there (a CPU-only torch, or no driver).")
    return mismatches, notes


# --- running the probe --------------------------------------------------------------------------

def _context(spark):
    if spark is not None:
        return getattr(spark, "sparkContext", spark)  # a SparkSession or a SparkContext
    from pyspark import SparkContext
    return SparkContext._active_spark_context


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
    driver = _row("driver", probe())
    sc = _context(spark)
    if sc is None:
        return EnvReport(master="no SparkSession", driver=driver, notes=[
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
    executors = [_row(where, infos) for where, infos in sorted(by_executor.items())]
    mismatches, notes = compare(driver, executors)
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
