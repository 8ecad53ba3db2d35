"""The notebook's side of a warm session's rank held in pdb (`hvd_magic.rank.debugger`).

A rank of a session cell stops in a real `pdb.Pdb` on its live frames: at its exception when
the session debugs (``%horovod_session start --debug``), or at ``hvd_magic.breakpoint()``. It
says so with a ``debug`` event (``"stopped"``), then sends what pdb printed each time pdb asks
for a command (``"prompt"``) and when it lets the rank go (``"released"``). `console` prints that
text, reads the person's next command with `input()` (as IPython's ``%debug`` does: a notebook's
input box, a terminal's line) and sends it back as a ``debug`` message over the session's
authenticated channel; its task writes it to the rank's stdin. No port of its own.

A foreground cell opens the console as soon as a rank stops (the notebook is waiting on that
cell anyway); ``%horovod_debug`` opens it for a background cell. The other ranks are told (a
``hold`` message): they wait before their next Horovod collective, on our channel
(`hvd_magic.rank.debugger.wait_while_held`). While a rank is held the run's
stall watchdog and ``--timeout`` are paused (`hvd_magic.driver.loop`); a stop of the run (Cancel,
a failure elsewhere) quits every held rank's pdb first.

`Debugging` is mixed into `Run`.
"""

import queue
import threading
import time

PROMPT = "(Pdb) "


class Debugging:
    """A run's ranks held in pdb (mixed into `Run`)."""

    def held(self):
        """Rank -> why it stopped, for the ranks in pdb now."""
        return self.__dict__.setdefault("_held", {})

    def _debug_queue(self, rank):
        return self.__dict__.setdefault("_debug_queues", {}).setdefault(rank, queue.Queue())

    def debug_event(self, rank, event):
        """A rank's ``debug`` event (the driver loop's thread)."""
        state = event.get("state")
        if state == "stopped":
            if not self.held():  # the others wait before their next collective
                self._server.broadcast({"t": "hold", "on": True})
            self.held()[rank] = str(event.get("why") or "stopped")
            if self.view is not None:
                self.view.event(self, None, {"t": "debug", "message":
                                f"rank {rank} stopped in pdb ({self.held()[rank]}): "
                                f"%horovod_debug drives it"})
        elif state == "released":
            self.unhold(rank)
        if state in ("prompt", "released"):
            self._debug_queue(rank).put(event)

    def unhold(self, rank):
        """`rank` is no longer held; with none left, the others' collectives go on."""
        if self.held().pop(rank, None) is not None and not self.held():
            self._server.broadcast({"t": "hold", "on": False})

    def debug_command(self, rank, line):
        self._server.broadcast({"t": "debug", "rank": rank, "cmd": line})

    def release_held(self):
        """Quit every held rank's pdb (the run stops)."""
        for rank in list(self.held()):
            self.debug_command(rank, "q")


def console(run, rank=None, out=print, read=input):
    """Drive rank `rank`'s pdb (the first held rank by default) until it lets the rank go;
    the rank's commands are read with `read` (`input`), what pdb prints goes to `out`. False
    when the rank ended or the run stopped before that (it is named)."""
    held = run.held()
    if rank is None:
        rank = min(held) if held else None
    if rank is None or rank not in held:
        return False
    events = run._debug_queue(rank)
    driver = run._driver
    in_loop = getattr(driver, "thread", None) == threading.get_ident()
    out(f"[hvd_magic] rank {rank} stopped: {held[rank]}. pdb on its live frames: p, pp, up, "
        f"where, any expression; c or q lets it go on.")
    while True:
        try:
            event = events.get(timeout=0.05) if not in_loop else events.get_nowait()
        except queue.Empty:
            if in_loop:
                driver._pump(0.05)  # (the rank's events come through the loop)
            if run.ranks[rank].exit is not None or run._done.is_set():
                out(f"[hvd_magic] rank {rank} ended while held in pdb")
                run.unhold(rank)
                return False
            continue
        text = str(event.get("text") or "")
        if event.get("state") == "released":
            if text:
                out(text, end="")
            return True
        prompt = PROMPT if text.endswith(PROMPT) else ""
        out(text[:len(text) - len(prompt)], end="")
        try:
            line = read(prompt)
        except (EOFError, KeyboardInterrupt):  # no more input, or the person's interrupt
            line = "q"
        run.debug_command(rank, line)


def pause(run, held_since):
    """A rank was let go after `held_since` (monotonic): the run's watchdog starts afresh."""
    now = time.monotonic()
    for r in run.ranks:
        if r.blocked_since is not None:
            r.blocked_since = now
        if r.usage.idle_since is not None:  # (a rank that waited on the held one)
            r.usage.idle_since = now
    return now - held_since
