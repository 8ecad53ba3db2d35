"""Ending a rank's process group: SIGTERM, a short grace, then SIGKILL."""

import os
import signal
import subprocess

STOP_GRACE_SECONDS = 3.0


def stop_group(proc, grace=STOP_GRACE_SECONDS, sent=None):
    """End the rank's whole process group: SIGTERM, a grace period, then SIGKILL. Each signal
    is added to the set `sent` before it goes: a rank that ended of a signal not in it (its own
    SIGKILL, the OOM killer's) was not ended by this stop, though a stop was asked for."""
    sent = set() if sent is None else sent
    if proc.poll() is not None:
        return
    try:
        sent.add(signal.SIGTERM)
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        sent.add(signal.SIGKILL)
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


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
