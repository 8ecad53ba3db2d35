"""Ending a rank's process group: SIGTERM, a short grace, then SIGKILL."""

import os
import signal
import subprocess

STOP_GRACE_SECONDS = 3.0


def stop_group(proc, grace=STOP_GRACE_SECONDS):
    """End the rank's whole process group: SIGTERM, a grace period, then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
