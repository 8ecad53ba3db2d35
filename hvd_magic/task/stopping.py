"""Ending a rank's process group: SIGTERM, a short grace, then SIGKILL."""

import os
import signal
import subprocess

STOP_GRACE_SECONDS = 3.0


def stop_group(proc, grace=STOP_GRACE_SECONDS, sent=None):
    """End the rank's whole process group: SIGTERM, a grace period, then SIGKILL. Each signal
    that goes while the rank itself lives is added to the set `sent`: a rank that ended of a
    signal not in it (its own SIGKILL, the OOM killer's) was not ended by this stop, though a
    stop was asked for. (What the rank left in its group gets both signals all the same.)"""
    sent = set() if sent is None else sent
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _ended(proc):
            sent.add(sig)
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGTERM:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass


def _ended(proc):
    """Whether the rank has ended, though its end may not be told yet: a forked rank is its
    template's child, and under load the template's word came seconds after the rank died of
    its own SIGKILL; a stop sent meanwhile counted that death as its own (a fresh clone's run)."""
    if proc.poll() is not None:
        return True
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")  # (a zombie: it ended)
    except FileNotFoundError:
        return os.path.isdir("/proc/self")  # reaped (where there is a /proc to ask)
    except OSError:
        return False


def ended_by(code, sent):
    """Whether a rank that exited with `code` was ended by a stop that sent the signals `sent`:
    a signal's death only by one of them; any other ending once one was sent."""
    if code is not None and code < 0:
        return -code in sent
    return bool(sent)


def kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
