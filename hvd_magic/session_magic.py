"""``%horovod_session`` and ``%%horovod`` cells that run in the warm session (see
`hvd_magic.driver.session`): the notebook side of sessions, as thin as the magics."""

from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from . import api
from .options import env_option


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
