"""A failed rank's frames, rebuilt on the driver as real frames for ``%debug`` and ``%pdb on``.

The rank sent its traceback's frames as plain JSON (`hvd_magic.rank.frames.capture`): file, line,
function, and each local as itself or as a bounded repr. pdb needs traceback and frame objects,
and Python 3.11 builds a traceback (`types.TracebackType`) only over a real frame; so each frame
here is a small stub code object compiled with the rank's file name, its function's name and its
line, run once with the rank's locals as its namespace until it raises. Its frame then reads, to
pdb, as the rank's: ``where``, ``up``, ``p loss``, ``list`` (the cells' and scripts' sources go
into `linecache`). A cell's frames are in ``<Cell In[5]>``, as IPython names the cell. Nothing is
unpickled: a value that came as a repr is a stand-in that shows the rank's text and answers
what was sent of it (`hvd_magic.driver.rank_locals`: ``p x.shape``).
"""

import builtins
import collections
import linecache
import types

from ..capture.cell import renamed
from ..errors import debugger_filename
from .rank_locals import standin

RankFrame = collections.namedtuple("RankFrame", "filename lineno name line locals")

_HERE = "__hvd_magic_frame__"


class _Here(Exception):
    """Raised by a stub at its frame's line: it keeps the frame alive in its traceback."""


def _stub_frame(filename, lineno, name, scope):
    """A real frame named like the rank's, stopped at `lineno`, whose locals are `scope`."""
    code = compile("\n" * (max(int(lineno), 1) - 1) + f"raise {_HERE}()", filename, "exec")
    code = renamed(code, str(name))
    namespace = {"__name__": "__main__", "__builtins__": builtins, _HERE: _Here}
    try:
        exec(code, namespace, scope)
    except _Here as here:
        return here.__traceback__.tb_next.tb_frame
    raise AssertionError("the stub did not raise")  # (it always does)


def register_sources(sources):
    """The rank's cells and scripts, for pdb's ``list`` and the traceback's lines."""
    for filename, text in (sources or {}).items():
        filename = debugger_filename(filename)
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)


def rebuild(record, rank=None):
    """(traceback, [RankFrame]) from a rank's `capture` record (of rank `rank`): the traceback's
    first entry is the outermost frame (the cell's or the script's), its last the one that
    raised."""
    register_sources(record.get("sources"))
    frames, tb = [], None
    for filename, lineno, name, line, _users, sent in record.get("frames", []):
        frames.append(RankFrame(debugger_filename(filename), lineno, name, line,
                                {k: standin(v, k, rank) for k, v in sent.items()}))
    for f in reversed(frames):
        frame = _stub_frame(f.filename, f.lineno, f.name, dict(f.locals))
        tb = types.TracebackType(tb, frame, frame.f_lasti, max(int(f.lineno), 1))
    return tb, frames


def attach(error):
    """Give a `RankError` whose rank sent its frames those frames: ``error.frames`` and, for
    ``%debug``, its traceback (`RankError.rank_traceback`). The error, for chaining."""
    record = error.info.get("postmortem")
    if not isinstance(record, dict) or not record.get("frames"):
        return error
    try:
        error.rank_traceback, error.frames = rebuild(record, error.rank)
    except (SyntaxError, ValueError, TypeError, AttributeError, KeyError):
        return error  # a record we cannot read: the traceback's text is still there
    return error.with_traceback(error.rank_traceback)
