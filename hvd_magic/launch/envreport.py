"""``%horovod_env``'s report: the driver's and each executor's packages side by side, and what
differs (`Mismatch`), with notes that say what a difference means.

Shown as an HTML table in a notebook (`EnvReport._repr_html_`) and as text elsewhere. The values
come from `hvd_magic.launch.envcheck.probe`, run on the driver and on every executor.

Not for: running anything on Spark (`hvd_magic.launch.envcheck`).
"""

import dataclasses
import html

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

PICKLE_ADVICE = (
    "Python or cloudpickle versions that differ between the driver and the executors are the "
    "commonest cause of a cell that unpickles on the driver but not on the workers: the cell's "
    "function is pickled by the driver's cloudpickle and unpickled by the executor's. Install the "
    "driver's versions on the executors (or point PYSPARK_PYTHON at an environment that has "
    "them).")


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


def env_row(where, infos):
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
                f"built by `python -m hvd_magic.build_horovod` (it carries the fix) or make the "
                f"hostname resolve to a routable address.")
        if row.values.get("spark_gpus") and row.values.get("cuda_device_count") == "0":
            notes.append(f"{row.where}: Spark assigns its tasks GPUs {row.values['spark_gpus']} "
                         f"but torch sees no GPU there (a CPU-only torch, or no driver).")
    return mismatches, notes


def template_notes(places):
    """A line for each place whose ranks fork from a template (`hvd_magic.template`): what it
    holds and its memory (PSS counts the pages it shares with its ranks once)."""
    notes = []
    for where, infos in places:
        status = next((i.get("template") for i in infos if i.get("template")), None)
        if status:
            notes.append(f"{where}: ranks are forked from a template (pid {status['pid']}) holding "
                         f"{', '.join(status['modules']) or 'no framework yet'}: RSS "
                         f"{(status['rss'] or 0) / 2**20:.0f} MB, PSS {(status['pss'] or 0) / 2**20:.0f} MB.")
    return notes
