"""``%horovod_session`` and ``%%horovod`` cells that run in the warm session (see
`hvd_magic.driver.session`): the notebook side of sessions, as thin as the magics."""

import sys

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from . import api
from .capture.session import capture_session_cell
from .options import env_option, names, positive
from .view import make_view


def run_in_session(magics, session, args, cell):
    placement = [flag for flag, given in (("--np", args.np is not None),
                                          ("--master", args.master), ("--env", args.env),
                                          ("--retries", args.retries),
                                          ("--timeline", args.timeline)) if given]
    if placement:
        raise UsageError(
            f"{' and '.join(placement)} cannot change where a cell runs while session "
            f"{session.id} is active ({session.np} ranks on {session.where}): drop "
            f"{'them' if len(placement) > 1 else 'it'}, or end the session first with "
            f"%horovod_session stop. (Inside a session cell, `with hvd_magic.timeline():` "
            f"records a timeline.)")
    shell = magics.shell
    cell_fn = capture_session_cell(cell, shell.user_ns, cell_id=shell.execution_count,
                                   export=names(args.export),
                                   hidden=set(shell.user_ns_hidden))
    view = make_view(quiet=args.quiet, widgets=False if args.text else None)
    timeout = positive("--timeout", args.timeout if args.timeout is not None else magics.timeout)
    try:
        run = api.run_in_session(
            session, cell_fn, view=view, timeout=timeout, background=args.background,
            name=args.name, broadcast_bytes=int(magics.broadcast_mb * 1024 * 1024),
            stall_timeout=positive("--stall-timeout", args.stall_timeout or magics.stall_timeout),
            on_stall=args.on_stall, run_root=magics.run_root)
    finally:
        if session.broken and not session.stopped:  # said once, under the cell that broke it
            print(f"[hvd_magic] session {session.id} needs a restart: {session.broken}. "
                  f"Run %horovod_session restart.", file=sys.stderr)
    if args.background:
        return run
    if run.exports:
        shell.user_ns.update(run.exports)
    return None if cell_fn.quiet else run.value


def session_magic(magics, line):
    """``%horovod_session [start|status|stop|restart]`` (see `HorovodMagics.horovod_session`)."""
    args = parse_argstring(magics.horovod_session, line)
    session = magics._active_session()
    if args.action == "status":
        if session is None:
            return print("No session. Start one: %horovod_session start --np 2")
        return print(session.status())
    if args.action in ("stop", "restart") and session is None and args.action == "stop":
        return print("No session to stop.")
    if session is not None:
        if args.action == "start":
            raise UsageError(f"session {session.id} is already active; "
                             "%horovod_session restart starts a new one.")
        options = session.options
        session.stop()
        magics.session = None
        if args.action == "stop":
            return print(f"session {session.id} stopped; its ranks ended.")
    else:
        options = {}
    if args.np is not None or args.action == "start":
        options = {"np": magics.np if args.np is None else args.np, "master": args.master,
                   "env": env_option(args.env),
                   "idle_timeout": magics.session_idle_timeout if args.idle_timeout is None
                   else args.idle_timeout}
    if not options:
        raise UsageError("No session to restart. Start one: %horovod_session start --np 2")
    api.check_np(options["np"])
    magics.session = api.start_session(
        options["np"], master=options["master"], spark_conf=dict(magics.spark_conf),
        horovod_env=dict(magics.horovod_settings), env=options["env"],
        idle_timeout=options["idle_timeout"] or None)
    magics.session.options = options
    print(magics.session.status())
