"""Errors a run can end with, rendered the way a notebook user needs to read them.

`RankError` shows the first failing rank's own traceback (its rank and host in the header), then
one line per other rank saying how it ended. IPython calls `_render_traceback_`, so the driver-side
stack (Spark, threads, this package) is never shown. A cell's frames are named as IPython names
a plain cell's (`name_cells`: ``Cell In[5], line 6``), in a debugger too (`debugger_filename`),
and what a cell defines by the name the user gave it (`unwrap_names`: ``Model``, not
``__cell__.<locals>.Model``).
"""

import re
import sys

from .words import size

# (Lightning's own SIGTERM handler raises SIGTERMException: the stop's signal, not a cause)
FOLLOW_ON_TYPES = {"HorovodInternalError", "HorovodShutdownError", "SIGTERMException"}
FOLLOW_ON_TEXT = ("Horovod has been shut down", "HorovodInternalError", "Broken pipe",
                  "Connection reset by peer", "Connection closed by peer",
                  # torch's TCPStore client whose server (rank 0's) went away
                  "Connection was likely closed")


_FRAME_LINE = re.compile(r'^\s*(?:File "|Cell In\[)', re.MULTILINE)  # a Python traceback's
_CELL_FRAME = re.compile(r'File "<hvd_magic cell ([^>]+)>", line (\d+)(, in <module>)?')
_CELL_FILE = re.compile(r"<hvd_magic cell ([^>]+)>")


def cell_filename(count):
    """The file name a cell's code is compiled with: the prompt number of the cell it came from."""
    return f"<hvd_magic cell {count}>"


def debugger_filename(filename):
    """The file name a debugger shows for a frame: a cell's is ``<Cell In[5]>``, as IPython names
    the cell (pdb keeps a name in angle brackets as it is, and takes any other for a path)."""
    cell = _CELL_FILE.fullmatch(str(filename))
    return f"<Cell In[{cell[1]}]>" if cell else filename


def name_cells_in_warnings():
    """Python's warnings from a cell's code name the cell as its tracebacks do: ``Cell In[5],
    line 6: UserWarning: ...`` (not its file name, ``<hvd_magic cell 5>:6: ...``). For a rank
    process, once; `warnings.showwarning` uses a replaced `warnings.formatwarning`."""
    import warnings

    plain = warnings.formatwarning
    if getattr(plain, "names_cells", False):
        return

    def formatwarning(message, category, filename, lineno, line=None):
        text = plain(message, category, filename, lineno, line)
        cell = _CELL_FILE.fullmatch(str(filename))
        return text.replace(f"{filename}:{lineno}:", f"Cell In[{cell[1]}], line {lineno}:", 1) \
            if cell else text

    formatwarning.names_cells = True
    warnings.formatwarning = formatwarning


# A cell runs as the body of a function (`hvd_magic.capture.cell`), so what it defines is named
# after that function: ``<function __cell__.<locals>.step>``, ``hvd_magic_cell.__cell__.<locals>.
# ShapeError: ...``. In a plain cell the same reads ``step``, ``ShapeError``.
_WRAPPER = re.compile(r"\b(?:hvd_magic_cell\.)?__cell__\.<locals>\.")


def unwrap_names(text):
    """`text` with the cell's wrapper function left out of the names in it."""
    return _WRAPPER.sub("", text)


def name_cells(traceback_text):
    """A formatted traceback with each cell frame named as IPython names a cell's frames:
    ``File "<hvd_magic cell 5>", line 6, in <module>`` becomes ``Cell In[5], line 6`` (the
    function's name stays where it is one the user wrote: ``Cell In[5], line 3, in train``),
    and what the cell defines by its own name (`unwrap_names`)."""
    return unwrap_names(_CELL_FRAME.sub(lambda m: f"Cell In[{m[1]}], line {m[2]}", traceback_text))


# What Horovod's C++ side and Gloo print when a peer went away (a rank died, the run was stopped):
# "[/tmp/pip-build-x/third_party/gloo/.../pair.cc:589] Read error [..]: Connection reset by peer",
# "terminate called after throwing an instance of 'gloo::EnforceNotMet'", its "what():" line.
_PEER_GONE = re.compile(r"Connection (?:reset|closed) by peer|Broken pipe|\bRead error\b"
                        r"|gloo::EnforceNotMet|terminate called after throwing"
                        r"|background loop uncaught exception|^\s*what\(\):")


def is_peer_gone(line):
    """True for a line that only says a peer went away: kept in the rank's log, never a rank's
    "last line" (a bystander's would read like the cause)."""
    return bool(_PEER_GONE.search(line))


# How a cluster manager says it took an executor for its memory: YARN ("Container killed by YARN
# for exceeding physical memory limits"), Kubernetes (the pod's reason, OOMKilled), the JVM.
_MEMORY_LOSS = re.compile(r"exceeding (?:physical |virtual )?memory limits|\bOOMKilled\b"
                          r"|java\.lang\.OutOfMemoryError")


def is_memory_loss(text):
    """True for Spark's word on a lost executor that says it was for memory."""
    return bool(_MEMORY_LOSS.search(text))


def is_follow_on(info):
    """True for errors that are consequences of another rank's failure, not causes. A rank
    that says its error is the code's own (``cause``: an OSError no collective raised, the
    code's own socket: `hvd_magic.rank.stall.code_error`) is never one, whatever its words."""
    if info.get("type") in FOLLOW_ON_TYPES:
        return True
    if info.get("cause") == "code":
        return False
    text = f"{info.get('message', '')}"
    return any(t in text for t in FOLLOW_ON_TEXT)


def describe_end(info):
    """One line: how a rank that did not succeed ended."""
    if info.get("type") == "Stall":
        return info.get("message", "stalled")
    if info.get("type"):
        message = unwrap_names(info.get("message", "")).strip().splitlines()
        return f"{info['type']}: {message[0] if message else ''}".rstrip(": ")
    if info.get("oom"):
        oom = info["oom"]
        whose = "its cgroup's" if oom.get("limit_of") == "cgroup" else "the host's memory"
        peak, limit = oom.get("peak") or 0, oom.get("limit") or 0
        if peak <= limit:
            return (f"out of memory: killed by {oom.get('by', 'the OOM killer')} at "
                    f"{size(peak)} (its limit: {size(limit)}, {whose})")
        # Resident memory counts in full the pages shared with other processes (a forked
        # rank's, the template's), which the limit counts once: it may read past the limit.
        return (f"out of memory: killed by {oom.get('by', 'the OOM killer')} as it reached "
                f"its limit (its limit: {size(limit)}, {whose}; its resident memory read "
                f"{size(peak)}, counting in full the pages it shares with other processes)")
    if info.get("signal"):
        return f"killed by {info['signal']}"
    if info.get("status") == "stopped":
        return "stopped"
    code = info.get("code")
    return f"exited with code {code}" if code is not None else "ended"


class HorovodMagicError(Exception):
    """Base of the errors a run raises. In a notebook they show as their message alone: the
    driver-side stack (threads, Spark, this package) says nothing a user can act on."""

    def _render_traceback_(self):
        return f"{type(self).__name__}: {self}".splitlines()


class LaunchError(HorovodMagicError):
    """The ranks could not be started (Spark or the rendezvous said no); says what to do."""


class RankError(HorovodMagicError):
    """A rank failed. `.rank`, `.host`, `.info` (the first failure), `.others` (rank -> line);
    `.frames`: its frames with their locals (`hvd_magic.driver.postmortem`), innermost last."""

    frames = ()
    rank_traceback = None        # those frames as a traceback: what %debug opens

    def __init__(self, info, others=None, run_id=None, note=None):
        self.info = info
        self.rank = info.get("rank")
        self.host = info.get("host")
        self.others = others or {}
        self.run_id = run_id
        self.note = note
        super().__init__(self.headline())

    def headline(self):
        if self.rank is None:  # the run as a whole (a stall), not one rank
            return describe_end(self.info)
        where = f"rank {self.rank}" + (f" on {self.host}" if self.host else "")
        return f"{where} failed: {describe_end(self.info)}"

    def traceback_title(self):
        # (a rank killed by a signal has its log's last lines, or faulthandler's, instead: a
        # "traceback" header over them promised what was not there)
        tb = self.info.get("traceback", "")
        what = "traceback of rank" if _FRAME_LINE.search(tb) else "rank"
        return f"{what} {self.rank} ({self.host})"

    def _render_traceback_(self):
        if self.rank_traceback is not None:  # %debug and %pdb open the rank's frames alone
            self.__traceback__ = self.rank_traceback
            if getattr(sys, "last_value", None) is self:
                sys.last_traceback = self.rank_traceback
        lines = [f"{type(self).__name__}: {self.headline()}"]
        if self.note:
            lines.append(self.note)
        tb = self.info.get("traceback", "").rstrip()
        if tb:
            lines.append(f"--- {self.traceback_title()} ---")
            lines.extend(tb.splitlines())
        if self.info.get("hint"):
            lines.append(self.info["hint"])
        if self.others:
            lines.append("--- the other ranks ---")
            for rank in sorted(self.others):
                lines.append(f"rank {rank}: {self.others[rank]}")
        return lines

    def __str__(self):
        return "\n".join(self._render_traceback_())


class ResultError(RankError):
    """A rank finished, but what it sent back (`.info["what"]`: its value, its timeline, its
    profile) could not be read in this notebook; `.info["traceback"]` is where reading it failed
    here (a class or module only the ranks have, a CUDA tensor and no GPU)."""

    def headline(self):
        whose = f"rank {self.rank}" + (f" on {self.host}" if self.host else "") \
            if self.rank is not None else "the run"
        return (f"{whose} finished, but its {self.info.get('what', 'value')} could not be read "
                f"in this notebook: {describe_end(self.info)}")

    def traceback_title(self):
        return f"reading rank {self.rank}'s {self.info.get('what', 'value')} in this notebook"


class RunStalled(RankError):
    """The stall watchdog stopped the run (``--on-stall fail``): ranks waited for peers that
    never came, or a rank waited long with no CPU and no collective. The message says where every
    rank was (its stack, grouped; the collectives' positions); a `RankError` for code that
    catches a run's failures as one."""

    def _render_traceback_(self):
        return [f"RunStalled: {line}" if i == 0 else line
                for i, line in enumerate(self.headline().splitlines())] + \
            ([self.note] if self.note else [])


class RunCancelled(HorovodMagicError):
    """The run was interrupted or cancelled; every rank was stopped."""


class RunTimeout(HorovodMagicError):
    """The run reached its --timeout; every rank was stopped."""


class InternalError(HorovodMagicError):
    """A bug on the driver's side (hvd_magic's own, or a view's) stopped the run: every rank was
    stopped rather than leaving the run "running" with nobody minding it."""
