"""Clicks on a running dashboard: its widgets' messages routed to a subshell of the kernel.

While a cell runs, the kernel's main thread is busy in the driver loop, so a Cancel click or a
panel opened would wait for the cell to end. With ipykernel 7's subshells (JEP 91) they are
handled at once, in a thread of their own (`route_to_subshell`).

Not for: what a click does (the dashboard's handlers).
"""

import threading

_subshells = {}                  # kernel -> subshell id: one subshell per kernel process, reused
_subshells_lock = threading.Lock()


def route_to_subshell(widgets):
    """Have the kernel deliver these widgets' front-end messages to a subshell; return its id.

    ipykernel 7 reads every shell message in its shell-channel thread and hands it to the main
    shell or to a subshell thread. For ``comm_msg`` it asks the comm where to go
    (``BaseComm._reply_subshell_for``), which answers ``_reply_subshell_id``. Setting that to a
    subshell of ours makes a click run `Button.click` in that subshell's thread while the main
    thread is still inside the cell. The attribute is reset whenever the main thread publishes on
    that comm, so only widgets we leave alone while the run lasts are routed. Returns None (clicks
    then wait for the cell to end, which is fine for --background runs) on other kernels.
    """
    subshell_id = _subshell()
    if subshell_id is None:
        return None
    for widget in widgets:
        comm = getattr(widget, "comm", None)
        if comm is None or not hasattr(comm, "_reply_subshell_for"):
            return None
        comm._reply_subshell_id = subshell_id
    return subshell_id


def _subshell():
    """A subshell of this kernel for widget messages (created once, as create_subshell_request does)."""
    try:
        from IPython import get_ipython
        kernel = getattr(get_ipython(), "kernel", None)
    except ImportError:
        return None
    thread = getattr(kernel, "shell_channel_thread", None)
    manager = getattr(thread, "manager", None)
    if manager is None or not hasattr(manager, "_create_subshell"):
        return None
    if threading.current_thread() is thread:
        return None  # we would wait on ourselves
    with _subshells_lock:
        if kernel in _subshells:
            return _subshells[kernel]
        created = {}
        done = threading.Event()

        def create():  # must run in the shell-channel thread, which owns the subshell table
            try:
                created["id"] = manager._create_subshell()
            finally:
                done.set()

        thread.io_loop.add_callback(create)
        if not done.wait(10) or "id" not in created:
            return None
        _subshells[kernel] = created["id"]
        return created["id"]
