"""The dashboard's widgets while the kernel's main thread is inside the cell: their front-end
messages (a Cancel click, an opened log panel) handled at once by a subshell of our own, and the
kernel still seen as busy meanwhile.

ipykernel 7 (JEP 91 subshells) reads every shell message in its shell-channel thread and hands it
to the main shell or to a subshell thread. A subshell handling a message publishes "busy", then
"idle" on IOPub, and JupyterLab shows the last status it got: without `hold`, the first widget
message handled by our subshell (the front end sends some as soon as the dashboard is drawn)
made the status bar say "Idle" while the cell still ran. ipykernel dispatches a comm message
that reaches a subshell whose lock is taken *concurrently* and without a status (the path meant
for async cells awaiting a widget): holding our subshell's lock for as long as the run lasts
(`hold`) keeps the kernel "busy" to the front end, and clicks still work.

The control channel does the same: every control message is answered between a "busy" and an
"idle" status, and JupyterLab (4.4+, ``commsOverSubshells``) sends one as our first widget
appears: a ``create_subshell_request`` for its own widget subshell. `busy_after_control` has the
kernel say "busy" again, for the running cell, right after each control message's "idle".

Not for: kernels without subshells (ipykernel < 7, other kernels): there clicks wait for the
cell to end, which is fine for --background runs, and the status is the main shell's own
(`hvd_magic.compat.ipykernel` reads the kernel's private members, and says once which is off).
"""

import inspect
import threading

from ..compat import ipykernel as kernel_compat

_subshells = {}                  # kernel -> subshell id: one subshell per kernel process, reused
_subshells_lock = threading.Lock()


def route_to_subshell(widgets):
    """Have the kernel deliver these widgets' front-end messages to a subshell; return its id.

    For ``comm_msg`` the shell-channel thread asks the comm where to go
    (``BaseComm._reply_subshell_for``), which answers ``_reply_subshell_id``. Setting that to a
    subshell of ours makes a click run `Button.click` in that subshell's thread while the main
    thread is still inside the cell. The attribute is reset whenever the main thread publishes on
    that comm, so only widgets we leave alone while the run lasts are routed. Returns None on
    other kernels.
    """
    subshell_id = _subshell()
    if subshell_id is None:
        return None
    for widget in widgets:
        comm = getattr(widget, "comm", None)
        if comm is None or not kernel_compat.route_comm(comm, subshell_id):
            return None
    return subshell_id


def hold(subshell_id):
    """Take the subshell's lock until the returned function is called (see the module's text):
    its widget messages are then handled without a busy/idle status. Returns a no-op where the
    kernel has no such lock."""
    thread = kernel_compat.subshell_thread(_kernel(), subshell_id)
    if thread is None:
        return lambda: None
    lock = thread.asyncio_lock
    held, release = threading.Event(), []

    async def keep():
        import asyncio

        done = asyncio.Event()
        release.append(done.set)
        async with lock:
            held.set()
            await done.wait()

    thread.io_loop.add_callback(keep)
    if not held.wait(5):
        return lambda: None

    def let_go():
        thread.io_loop.add_callback(release[0])

    return let_go


def busy_after_control():
    """Until the returned function is called, each control message that the kernel handles is
    followed by a "busy" status of the running cell (call it on the main thread, in the cell).
    Returns a no-op on kernels without a control thread of this kind."""
    kernel = _kernel()
    handlers = getattr(kernel, "control_handlers", None)
    loop = getattr(getattr(kernel, "control_thread", None), "io_loop", None)
    if not isinstance(handlers, dict) or loop is None:
        return lambda: None
    publish = kernel_compat.status_publisher(kernel)
    if publish is None:
        return lambda: None
    cell = kernel.get_parent("shell")  # the running cell's execute_request
    original = dict(handlers)
    running = threading.Event()
    running.set()

    def busy_again():
        if running.is_set():  # (never after the cell's end: its own "idle" is the last word)
            publish("busy", "shell", cell)

    def wrap(handler):
        async def handle(*args, **kwargs):
            result = handler(*args, **kwargs)
            if inspect.isawaitable(result):
                await result
            # The kernel publishes "idle" once this returns, without yielding to its loop
            # (ipykernel's process_control): a callback of that loop comes after it.
            loop.add_callback(busy_again)
        return handle

    handlers.update({name: wrap(handler) for name, handler in original.items()})

    def restore():
        running.clear()
        handlers.update(original)

    return restore


def _kernel():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return getattr(get_ipython(), "kernel", None)


def _subshell():
    """A subshell of this kernel for widget messages (created once, as create_subshell_request does)."""
    kernel = _kernel()
    if kernel is None:
        return None
    make, thread = kernel_compat.subshell_maker(kernel)
    if make is None:
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
                created["id"] = make()
            finally:
                done.set()

        thread.io_loop.add_callback(create)
        if not done.wait(10) or "id" not in created:
            return None
        _subshells[kernel] = created["id"]
        return created["id"]
