"""The rank table's HTML, plain functions of a run's state: a row per rank in columns sized to
what they hold, a rank's log panel, the footer's links to the logs. The dashboard draws them (and
`hvd_magic.view.summary` its pinned rows and the rank picker's row with them).

Lines are kept raw by the dashboard and shown here as a terminal would have left them
(`hvd_magic.lines`: a bar's last redraw, no escape codes), cut at `TAIL_LINE_CHARS`, the C++
libraries' start-up chatter left out unless verbose, and a stack dump (the hang watchdog's), a
warning or an advert never a rank's last line while it said anything else.

Not for: widgets, or when anything is redrawn (`hvd_magic.view.dashboard`).
"""

import html
import os
import re

from ..driver.ranks import LIVE_STATES
from ..words import plural, size
from ..errors import is_peer_gone
from ..lines import is_aside, is_chatter, is_warning, last_said, screen
from .summary import SUMMARY_ABOVE, threads_text

TAIL_LINE_CHARS = 2000     # a longer line is cut in the panel (never in the log on disk)
LAST_LINE_CHARS = 400      # sent for the last-line cell; the table cuts it to its width
# The rank table's columns. Each but the last is as wide as what it holds (progress and metrics
# whole), and one that is empty in every row is left out; the last line takes the rest of the
# width, on one line: a longer one is cut at its start, so that its end (a value, an error's
# message) stays in view, and is whole on hover.
COLUMNS = ("rank", "host", "local rank", "device", "state", "cpu", "memory", "gpu", "progress",
           "metrics", "last line")
ALWAYS = ("rank", "state", "last line")
# The table fits any width: the metrics (whole in the charts and on hover) and the progress bar
# shrink with the output's width (cqw: a hundredth of it), a live row's memory says its peak only
# when that says more, and a header may wrap; narrower than that, it scrolls sideways, the memory
# early in the row and the last line held at the right edge (sticky) so that both stay in view.
# (table-layout: JupyterLab's rendered HTML makes tables fixed, squeezing every column alike)
TABLE_OPEN = ("<div style='overflow-x:auto;container-type:inline-size'>"
              "<table style='border-collapse:collapse;table-layout:auto;width:100%'>")
TABLE_CLOSE = "</table></div>"
# (line-height: the same rows in a widget, whose HTML is spaced for controls, and after it)
_CELL_STYLE = "padding:0 .4em;white-space:nowrap;text-align:left;line-height:1.6"
_FIT = _CELL_STYLE + ";width:1%"
_LAST = (_CELL_STYLE + ";max-width:0;min-width:max(8em,15cqw);width:100%;overflow:hidden;"
         "text-overflow:ellipsis;direction:rtl;position:sticky;right:0;"
         "background:var(--jp-layout-color0,#fff)")
_STYLES = {"last line": _LAST}
RSS_MEANS = ("resident memory of the rank's processes: it counts the libraries it imported "
             "(torch's ~160 MB) and pages it shares with the other ranks of a template")
PEAK_SAID_ABOVE = 1.25     # a live row's peak memory is in its cell above this times its memory now
_METRICS_MAX = "min(36em,18cqw)"      # metrics beyond this are cut (whole on hover)
# The lines of a Python stack dump (faulthandler's, which the hang watchdog asks for): kept in
# the rank's log, never its "last line" (its outermost frame read like a crash).
_STACK_LINE = re.compile(r"(?:(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):"
                         r"|Stack \(most recent call first\):"
                         r'|  File ".*", line \d+ in \S.*|  <no Python frame>|  \.\.\.)\s*$')
_STATE_COLORS = {"done": "#2e7d32", "failed": "#c62828", "timeout": "#c62828", "lost": "#e65100",
                 "cancelled": "#757575", "stopped": "#757575", "running": "#1565c0", "starting": "#6a1b9a",
                 "preparing": "#6a1b9a"}
LINK_COLOUR = "var(--jp-content-link-color, #1976d2)"


def is_stack_line(line):
    """True for a line of a faulthandler stack dump (``Thread 0x… (most recent call first):``,
    ``  File "…", line 198 in _run_module_as_main``)."""
    return bool(_STACK_LINE.match(line))


def head_html(columns=COLUMNS):
    return "<tr>" + "".join(f"<th style='{_STYLES.get(name, _FIT + ';white-space:normal')}'>"
                            f"{name}</th>" for name in columns) + "</tr>"


TABLE_HEAD = TABLE_OPEN + head_html()  # every column: a summary's pinned rows, the rank picker


def table_html(run, tails, verbose=False):
    """The rank table: a row per rank; `tails` are the ranks' raw log tails. A column that is
    empty in every row is left out."""
    cells = [(r, _cells(r, tails[r.rank], verbose)) for r in run.ranks]
    columns = [name for name in COLUMNS
               if name in ALWAYS or any(c[name][0] for _, c in cells)]
    return (TABLE_OPEN + head_html(columns)
            + "".join(_row(r, c, columns) for r, c in cells) + TABLE_CLOSE)


def row_html(r, tail, verbose=False, columns=COLUMNS):
    """A rank's row; its last line is the last one of `tail` that is not start-up chatter, a
    stack dump's or blank."""
    return _row(r, _cells(r, tail, verbose), columns)


def last_line(tail, verbose=False):
    """What the last-line column shows of a rank's raw tail of (stream, line): its newest line's
    last redraw, escape codes dropped; never a stack dump's line, nor a C++ line saying only that
    a peer went away (both stay in the log); a warning or an advert only if nothing else is
    there (`hvd_magic.lines.last_said`)."""
    def skip(raw, text):
        return is_stack_line(text) or is_peer_gone(text) or (not verbose and is_chatter(raw))

    return last_said((line for _, line in reversed(tail)), skip)[0][:TAIL_LINE_CHARS]


def _cells(r, tail, verbose):
    """{column: (html, title)} of a rank's row."""
    metrics = _metrics_text(r.metrics)
    last = last_line(tail, verbose)
    return {"rank": _rank_cell(r), "host": (_e(r.host or ""), r.host or ""),
            "local rank": ("" if r.local_rank is None else str(r.local_rank), ""),
            "device": (_e(_device(r.gpus, r.threads, r.gpu_index)), threads_text([r])),
            "state": (state_html(r.state) + (f" <span style='color:#757575'>attempt {r.attempt}"
                                             "</span>" if r.attempt > 1 else ""),
                      f"its process was lost; this is its process number {r.attempt}"
                      if r.attempt > 1 else ""),
            "progress": (_progress_html(r.step, r.total), ""),
            "metrics": (f"<span style='display:inline-block;max-width:{_METRICS_MAX};"
                        f"overflow:hidden;text-overflow:ellipsis;vertical-align:bottom'>"
                        f"{_e(metrics)}</span>" if metrics else "", metrics),
            **_usage_cells(getattr(r, "usage", None), r.state not in LIVE_STATES),
            # (dir: the line reads left to right inside the right-to-left cell that cuts it)
            "last line": (f"<code dir='ltr' style='white-space:pre'>{_e(last[-LAST_LINE_CHARS:])}"
                          "</code>" if last else "",
                          last)}


def _rank_cell(r):
    """An elastic run's row is a slot; the rank its process has in the current world or ring,
    when another, follows in grey."""
    now = r.horovod_rank
    if now is None or now == r.rank:
        return str(r.rank), ""
    return (f"{r.rank} <span style='color:#757575'>({now} now)</span>",
            f"row {r.rank}: rank {now} in the current world of ranks")


def _usage_cells(usage, ended=False):
    """The cpu, memory and gpu cells of a rank's row: its latest sample, and its peak memory (a
    rank that `ended` has only its peaks: its last sample may be of a process already gone); a
    rank past NEAR_LIMIT of its memory limit is marked red, saying how near."""
    latest = usage.latest if usage is not None else None
    if latest is None:
        return {"cpu": ("", ""), "memory": ("", ""), "gpu": ("", "")}
    peak_cpu, cores = usage.cpu_share(usage.peak_cpu)
    of_cores = f"of the {plural(cores, 'core')} it may use"
    if ended:
        peak = f"peak {size(usage.peak_rss)}"
        return {"cpu": (f"peak {peak_cpu:.0f}%", of_cores), "memory": (peak, RSS_MEANS),
                "gpu": ("", "")}
    rss, limit = latest.get("rss", 0), latest.get("limit") or 0
    # (the peak when it says more than the memory now: the cell stays narrow)
    memory = size(rss) + (f" (peak {size(usage.peak_rss)})"
                          if usage.peak_rss > PEAK_SAID_ABOVE * rss else "")
    where = "its cgroup's" if latest.get("limit_of") == "cgroup" else "the host's memory"
    title = "; ".join([f"peak {size(usage.peak_rss)}"]
                      + ([f"limit {size(limit)}: {where}"] if limit else []) + [RSS_MEANS])
    html = _e(memory)
    if usage.near_limit():
        # (resident memory counts in full the pages shared with other processes, which the
        # limit counts once: past 100% it reads "at its limit", and says why in the cell)
        near = f"{rss / limit:.0%} of its limit" if rss < limit else \
            "at its limit (resident memory counts shared pages in full)"
        html = (f"<span style='color:{_STATE_COLORS['failed']}' data-near-limit>{html} ⚠ "
                f"{near}</span>")
    gpus = "  ".join(f"gpu{g['index']} {g.get('util') or 0}% {size(g.get('mem') or 0)}"
                     for g in latest.get("gpus") or ())
    return {"cpu": (f"{usage.cpu_share()[0]:.0f}%", f"{of_cores}; peak {peak_cpu:.0f}%"),
            "memory": (html, title), "gpu": (_e(gpus), gpus)}


def _row(r, cells, columns):
    step = "" if r.step is None else r.step
    total = "" if r.total is None else r.total
    return (f"<tr data-rank='{r.rank}' data-state='{_e(r.state)}' data-step='{step}' "
            f"data-total='{total}'>"
            + "".join(f"<td style='{_STYLES.get(name, _FIT)}'"
                      + (f" title='{_e(cells[name][1])}'" if cells[name][1] else "")
                      + f">{cells[name][0]}</td>" for name in columns) + "</tr>")


def log_html(run, rank, tail, verbose=False, limit=None):
    """A rank's log panel: its tail (chatter left out unless verbose) as a terminal would show it
    (`hvd_magic.lines.screen`: a bar's last redraw, no escape codes), its last `limit` rows,
    newest in view, and a link to the whole log."""
    lines = [line for _, line in tail if verbose or not is_chatter(line)]
    rows = screen(lines)
    rows = [row[:TAIL_LINE_CHARS] for row in (rows[-limit:] if limit else rows)]
    total = run.ranks[rank].lines
    shown = (f"last {len(rows)} of {plural(total, 'line')}" if total > len(rows)
             else plural(total, "line"))
    body = "\n".join(f"<span style='color:{colour}'>{_e(text)}</span>" if colour else _e(text)
                     for text, colour in zip(rows, _colours(rows)))
    # column-reverse keeps the panel scrolled to its newest line.
    return (f"<div style='font-size:90%;color:#757575'>{shown}; full log: "
            f"{_log_links(run, rank)}</div>"
            "<div style='max-height:22em;overflow-y:auto;display:flex;"
            "flex-direction:column-reverse'>"
            f"<pre style='margin:0;white-space:pre-wrap'>{body}</pre></div>")


def _colours(rows):
    """Each row's colour, or None. stderr is a rank's output like stdout (Lightning writes all it
    says there): a Python traceback is red, from its first line to the exception's; a stack dump
    the watchdog asked for, a warning and an advert are grey (no error, and not the rank's own
    words)."""
    colours = []
    in_traceback = warned = False
    for text in rows:
        if text.startswith("Traceback (most recent call last):"):
            in_traceback = True
        if in_traceback:
            colours.append("#c62828")
            # (the exception's line, the first unindented one after the frames, ends it)
            in_traceback = text[:1].isspace() or text.startswith("Traceback") or not text
        elif is_stack_line(text) or is_aside(text) or (warned and text[:1].isspace()):
            colours.append("#757575")  # (an indented line under a warning: its source line)
        else:
            colours.append(None)
        warned = is_warning(text)
    return colours


def footer_html(run):
    """Links to the run folder and the ranks' logs (the first SUMMARY_ABOVE ranks' and the
    last's: the folder holds them all)."""
    if run.started is None:  # never launched: no run folder
        return ""
    shown = [rank for rank in range(run.np) if rank < SUMMARY_ABOVE or rank == run.np - 1]
    links = [f"rank {rank}: {_log_links(run, rank)}" for rank in shown]
    if len(shown) < run.np:  # say that ranks were skipped
        links.insert(-1, "…")
    links = " · ".join(links)
    return f"<div>Logs in {link_html(run.run_dir, os.path.relpath(run.run_dir))}: {links}</div>"


def _log_links(run, rank):
    """The rank's full log as a person reads it, and beside it every byte it printed; an
    elastic run's lost processes' logs after them (what the lost one said last)."""
    earlier_logs = getattr(getattr(run, "folder", None), "earlier_logs", None)
    earlier = earlier_logs(rank) if earlier_logs is not None else []
    lost = f" (lost: {', '.join(link_html(p) for p in earlier)})" if earlier else ""
    return (f"{link_html(run.log_path(rank, readable=True))} "
            f"({link_html(run.log_path(rank), 'raw')}){lost}")


def _e(text):
    return html.escape(str(text), quote=True)


def _device(gpus, threads=None, index=()):
    """"GPU 6 (cuda:1)": the rank's own GPU and its place in what the rank sees; or "cpu ×2": a
    CPU rank's threads (its share of the host's cores)."""
    if gpus:
        where = f" (cuda:{','.join(str(i) for i in index)})" if index else ""
        return "GPU " + ",".join(str(g) for g in gpus) + where
    return f"cpu ×{threads}" if threads else "cpu"


def state_html(state):
    color = _STATE_COLORS.get(state, "#424242")
    return f"<span style='color:{color};font-weight:bold'>{_e(state)}</span>"


def _progress_html(step, total):
    if step is None:
        return ""
    if isinstance(total, (int, float)) and total > 0:
        return (f"<progress value='{min(step, total)}' max='{total}' style='width:min(6em,7cqw)'>"
                "</progress>"
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
    # (coloured here: JupyterLab colours the links of an output's HTML, not a widget's)
    return (f"<a href='{_e(rel)}' target='_blank' style='color:{LINK_COLOUR}'>"
            f"{_e(text or os.path.basename(path))}</a>")
