"""ipykernel's subshell internals (ipykernel 7, JEP 91) that the dashboard uses while a cell
runs (`hvd_magic.view.subshell`): making a subshell, routing a widget's comm to it, taking its
lock, and publishing the kernel's status. pyproject allows ipykernel >= 6, which has none of
them: each is looked up on the kernel's own objects, and where one is missing the caller does
without it, said once.

Imports nothing: it is handed the kernel's objects.
"""

from . import private, unavailable

LATE_CLICKS = "the dashboard's buttons and panels answer only when the cell ends"
IDLE_SHOWN = "the front end may show the kernel idle while a cell still runs"


def subshell_maker(kernel):
    """The call that makes a subshell of `kernel` (it must run in the shell-channel thread, as a
    ``create_subshell_request`` does) and that thread, or (None, None) where the kernel has no
    subshells."""
    thread = getattr(kernel, "shell_channel_thread", None)
    make = getattr(getattr(thread, "manager", None), "_create_subshell", None)
    if make is None:
        unavailable("ipykernel", "kernel subshells", LATE_CLICKS)
        return None, None
    return make, thread


def route_comm(comm, subshell_id):
    """Have the kernel deliver `comm`'s front-end messages to subshell `subshell_id` (ipykernel
    asks ``Comm._reply_subshell_for``, which answers ``_reply_subshell_id``). False where this
    comm is not routed so."""
    if not hasattr(comm, "_reply_subshell_for"):
        unavailable("ipykernel", "a comm's messages routed to a subshell", LATE_CLICKS)
        return False
    comm._reply_subshell_id = subshell_id
    return True


def subshell_thread(kernel, subshell_id):
    """The thread of `kernel`'s subshell `subshell_id` (its ``asyncio_lock`` and ``io_loop``), or
    None where the kernel cannot say."""
    manager = getattr(getattr(kernel, "shell_channel_thread", None), "manager", None)
    find = getattr(manager, "_get_subshell", None)
    try:
        thread = find(subshell_id) if find is not None else None
    except KeyError:  # a subshell deleted since (not a missing feature)
        return None
    if thread is None or not hasattr(thread, "asyncio_lock") or not hasattr(thread, "io_loop"):
        unavailable("ipykernel", "a subshell's lock", IDLE_SHOWN)
        return None
    return thread


def status_publisher(kernel):
    """`kernel`'s ``_publish_status(status, channel, parent)``, or None where it has none."""
    return private(kernel, "_publish_status", "ipykernel", "Kernel._publish_status", IDLE_SHOWN)
