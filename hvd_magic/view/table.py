"""The rank table's HTML, plain functions of a run's state: a row per rank in fixed columns, a
rank's log panel, the footer's links to the logs. The dashboard draws them (and
`hvd_magic.view.summary` its pinned rows and the rank picker's row with them).

Lines are kept raw by the dashboard and shown here: a line's last redraw (``\r``), cut at
`TAIL_LINE_CHARS`, the C++ libraries' start-up chatter left out unless verbose.

Not for: widgets, or when anything is redrawn (`hvd_magic.view.dashboard`).
"""

import html
import os

from .summary import SUMMARY_ABOVE, threads_text
from .text import is_chatter, visible_text

TAIL_LINE_CHARS = 2000     # a longer line is cut in the panel (never in the log on disk)
LAST_LINE_CHARS = 400      # sent for the last-line cell; the table cuts it to its width
# The rank table's columns (the last line takes the rest): fixed, so that a long last line or many
# metrics never reflow the table; what does not fit ends with an ellipsis (whole on hover).
COLUMNS = (("rank", "4em"), ("host", "8em"), ("local rank", "7em"), ("device", "5em"),
           ("state", "7em"), ("progress", "11em"), ("metrics", "15em"), ("last line", "auto"))
_CELL_STYLE = "padding:0 .6em;white-space:nowrap;overflow:hidden;text-overflow:ellipsis"
HEAD_HTML = ("<colgroup>" + "".join(f"<col style='width:{width}'>" for _, width in COLUMNS)
         + "</colgroup><tr>" + "".join(f"<th style='text-align:left;{_CELL_STYLE}'>{name}</th>"
                                       for name, _ in COLUMNS) + "</tr>")
_STATE_COLORS = {"done": "#2e7d32", "failed": "#c62828", "timeout": "#c62828",
                 "cancelled": "#757575", "running": "#1565c0", "starting": "#6a1b9a",
                 "preparing": "#6a1b9a"}


def table_html(run, tails, verbose=False):
    """The rank table: a row per rank, fixed columns; `tails` are the ranks' raw log tails."""
    rows = [HEAD_HTML] + [row_html(r, tails[r.rank], verbose) for r in run.ranks]
    return ("<table style='border-collapse:collapse;table-layout:fixed;width:100%'>"
            + "".join(rows) + "</table>")


def row_html(r, tail, verbose=False):
    """A rank's row; its last line is the last one of `tail` that is not start-up chatter."""
    step = "" if r.step is None else r.step
    total = "" if r.total is None else r.total
    metrics = _metrics_text(r.metrics)
    last = next((_shown(line) for _, line in reversed(tail)
                 if verbose or not is_chatter(line)), "")
    cells = [(str(r.rank), ""), (_e(r.host or ""), r.host or ""),
             ("" if r.local_rank is None else str(r.local_rank), ""),
             (_e(_device(r.gpus, r.threads)), threads_text([r])), (state_html(r.state), ""),
             (_progress_html(r.step, r.total), ""), (_e(metrics), metrics),
             (f"<code>{_e(last[:LAST_LINE_CHARS])}</code>", last)]
    return (f"<tr data-rank='{r.rank}' data-state='{_e(r.state)}' data-step='{step}' "
            f"data-total='{total}'>"
            + "".join(f"<td style='{_CELL_STYLE}'" + (f" title='{_e(title)}'" if title else "")
                      + f">{c}</td>" for c, title in cells) + "</tr>")


def log_html(run, rank, tail, verbose=False):
    """A rank's log panel: its tail (chatter left out unless verbose), newest line in view, and
    a link to the whole log."""
    tail = [(stream, _shown(line)) for stream, line in tail if verbose or not is_chatter(line)]
    total = run.ranks[rank].lines
    shown = (f"last {len(tail)} of {total} lines" if total > len(tail) else f"{total} lines")
    body = "\n".join(f"<span style='color:#c62828'>{_e(text)}</span>" if stream == "stderr"
                     else _e(text) for stream, text in tail)
    # column-reverse keeps the panel scrolled to its newest line.
    return (f"<div style='font-size:90%;color:#757575'>{shown}; full log: "
            f"{link_html(run.log_path(rank))}</div>"
            "<div style='max-height:22em;overflow-y:auto;display:flex;"
            "flex-direction:column-reverse'>"
            f"<pre style='margin:0;white-space:pre-wrap'>{body}</pre></div>")


def footer_html(run):
    """Links to the run folder and the ranks' logs (the first SUMMARY_ABOVE ranks' and the
    last's: the folder holds them all)."""
    if run.started is None:  # never launched: no run folder
        return ""
    links = " · ".join(f"rank {rank}: {link_html(run.log_path(rank))}" for rank in range(run.np)
                       if rank < SUMMARY_ABOVE or rank == run.np - 1)
    return f"<div>Logs in {link_html(run.run_dir, os.path.relpath(run.run_dir))}: {links}</div>"


def _e(text):
    return html.escape(str(text), quote=True)


def _shown(line):
    """What a panel shows of a line: its last redraw, cut at TAIL_LINE_CHARS."""
    return visible_text(line)[:TAIL_LINE_CHARS]


def _device(gpus, threads=None):
    """"GPU 0", or "cpu ×2": a CPU rank's threads (its share of the host's cores)."""
    if gpus:
        return "GPU " + ",".join(str(g) for g in gpus)
    return f"cpu ×{threads}" if threads else "cpu"


def state_html(state):
    color = _STATE_COLORS.get(state, "#424242")
    return f"<span style='color:{color};font-weight:bold'>{_e(state)}</span>"


def _progress_html(step, total):
    if step is None:
        return ""
    if isinstance(total, (int, float)) and total > 0:
        return (f"<progress value='{min(step, total)}' max='{total}' style='width:6em'></progress>"
                f" {step}/{total}")
    return f"step {_e(step)}"


def _metrics_text(metrics):
    parts = []
    for key, value in metrics.items():
        if isinstance(value, float):
            value = f"{value:.4g}"
        parts.append(f"{key}={value}")
    return "  ".join(parts)


def link_html(path, text=None):
    """A link relative to the kernel's folder, which JupyterLab resolves against the notebook's."""
    rel = os.path.relpath(path)
    return f"<a href='{_e(rel)}' target='_blank'>{_e(text or os.path.basename(path))}</a>"
