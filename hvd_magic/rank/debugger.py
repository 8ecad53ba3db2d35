"""A warm session's rank held in a real pdb, driven from the notebook (`hvd_magic.driver.debugger`).

Two ways in: a session cell raised while the session debugs (``%horovod_session start --debug``:
the job says ``"debug"``), and `breakpoint` called in a session cell. Either way the rank's main
thread runs `pdb.Pdb` on its live frames, with
- stdin: the rank's job pipe from its task. Each command comes as a ``{"debug": line}`` job (the
  driver's ``debug`` message, over the session's authenticated channel; no port of its own); the
  pipe's end (the session stopped) reads as end of input, which quits pdb;
- stdout: the rank's event pipe. What pdb printed goes out as a ``debug`` event when pdb asks
  for its next command (``"prompt"``) and when it lets the rank go (``"released"``: ``c``, ``q``).

The frames shown stop at the cell's: hvd_magic's own (the session's loop) are not the user's.
While one rank is held the others are told (``hold``, from the driver, through each task's probe
pipe): their next collective waits in `wait_while_held`, on our channel, not inside Horovod.
"""

import builtins
import os
import sys
import threading

from ..errors import debugger_filename
from . import reporting

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_go = threading.Event()   # clear while a peer is held in pdb: collectives wait (`wait_while_held`)
_go.set()
_in_pdb = threading.local()
next_job = None   # reads the session's next job (`hvd_magic.rank.session.serve` sets it)


class _Output:
    """pdb's stdout: what it prints goes out with its next prompt, or when the rank is released."""

    def __init__(self):
        self.parts = []

    def write(self, text):
        self.parts.append(text)
        return len(text)

    def flush(self):
        pass

    def send(self, state):
        text, self.parts = "".join(self.parts), []
        reporting.send({"t": "debug", "state": state, "text": text})


class _Commands:
    """pdb's stdin: each line is the notebook's next command."""

    def __init__(self, out):
        self.out = out

    def readline(self):
        self.out.send("prompt")
        job = next_job()
        if not isinstance(job, dict) or "debug" not in job:
            return ""  # the session ends: end of input, pdb quits
        return str(job["debug"]).splitlines()[0] + "\n" if str(job["debug"]).strip() else "\n"


def _pdb_class():
    """`_Pdb`, made on first use: pdb is imported only by a rank that stops."""
    import pdb

    class _Pdb(pdb.Pdb):
        """pdb whose assignments to a frame's locals (``loss = 0.25``) reach the running code.

        Before Python 3.13 a frame's locals dict is a copy, which pdb's own trace function writes
        back; this pdb traces nothing (the rank waits in `interaction`), so each frame shown is
        written back when the rank goes on. Only frames shown: another's copy may be stale."""

        def format_stack_entry(self, frame_lineno, lprefix=": "):
            # a cell's frames named as IPython names the cell, as the notebook's %debug does:
            # ``> <Cell In[4]>(5)scale_batch()`` (the file name stays for `list` and breakpoints)
            frame = frame_lineno[0]
            filename = self.canonic(frame.f_code.co_filename)
            entry = super().format_stack_entry(frame_lineno, lprefix)
            return entry.replace(filename, debugger_filename(filename), 1)

        def setup(self, f, tb):
            super().setup(f, tb)
            self.shown = {id(self.curframe): (self.curframe, self.curframe_locals)}

        def _select_frame(self, number):
            super()._select_frame(number)
            self.shown[id(self.curframe)] = (self.curframe, self.curframe_locals)

        def write_back(self):
            if sys.version_info >= (3, 13):  # (PEP 667: f_locals writes through)
                return
            import ctypes

            # (never read `f_locals` here: that copies the frame's values over pdb's assignments)
            for frame, _ in getattr(self, "shown", {}).values():
                ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))

    return _Pdb


def hold_others(on):
    """The task says a peer is held in pdb (on) or no longer is (its probe pipe: rank/stacks.py)."""
    (_go.clear if on else _go.set)()


def wait_while_held():
    """Before a collective: wait while a peer is held in pdb, here, not inside Horovod (whose
    waits and timeouts would then count a person's debugging). Not in pdb's own commands."""
    if not _go.is_set() and not getattr(_in_pdb, "on", False):
        _go.wait()


def _users(frame):
    return not frame.f_code.co_filename.startswith(_PACKAGE)


def hold(why, frame=None, tb=None):
    """Stop here in pdb until the notebook's ``c`` or ``q``: at `frame` (a breakpoint), or
    post-mortem at traceback `tb` (an exception)."""
    while tb is not None and not _users(tb.tb_frame):  # from the cell's frame in
        tb = tb.tb_next
    out = _Output()
    debugger = _pdb_class()(stdin=_Commands(out), stdout=out, nosigint=True, readrc=False)
    debugger.reset()  # (as pdb.post_mortem does: `c` needs its bottom frame)
    if frame is not None:  # `up` goes as far as the cell's frame
        top = frame
        while top.f_back is not None and _users(top.f_back):
            top = top.f_back
        debugger.botframe = top
    reporting.send({"t": "debug", "state": "stopped", "why": why})
    _in_pdb.on = True
    try:
        debugger.interaction(frame, tb)
        debugger.write_back()
    except Exception as exc:  # never the rank's end: the cell goes on (or ends with its error)
        out.write(f"*** the debugger failed: {type(exc).__name__}: {exc}\n")
    finally:
        _in_pdb.on = False
        out.send("released")


def breakpoint(rank=0):
    """Stop this rank of a warm session's cell here in pdb, which ``%horovod_debug`` drives from
    the notebook (the cell's own foreground run opens it at once); the other ranks wait before
    their next Horovod collective, on our channel. `rank`: which rank stops (0 by default;
    None: every rank). Outside a rank, Python's own `breakpoint()`; in a one-off run's rank
    (not a session's), nothing: its stdin is not the notebook's."""
    here = os.environ.get("HOROVOD_RANK")
    if here is None:
        return builtins.breakpoint()
    if rank is not None and int(here) != int(rank):
        return None
    if next_job is None:
        print("[hvd_magic] breakpoint() stops a rank only in a warm session's cell "
              "(%horovod_session start): ignored here", file=sys.stderr)
        return None
    return hold(f"hvd_magic.breakpoint() on rank {here}", frame=sys._getframe(1))
