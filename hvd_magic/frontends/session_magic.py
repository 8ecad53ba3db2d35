"""``%horovod_session`` and ``%%horovod`` cells that run in the warm session (see
`hvd_magic.driver.session`): the notebook side of sessions, as thin as the magics, and what
``%horovod_session`` says of one (`status`)."""

import os
import socket
import time

import psutil
from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .. import api
from ..config import Placement
from ..words import plural
from .options import env_option, summary_first


@summary_first
@magic_arguments()
@argument("action", nargs="?", default="status", choices=("start", "status", "stop", "restart"),
          help="start (the options below), status (the default), stop, restart (stop, then "
               "start with the same options).")
@argument("--np", "-n", type=int, default=None,
          help="Ranks, as for %%%%horovod: N on Spark executors, -N on the driver "
               "(default: HorovodMagics.np).")
@argument("--master", type=str, default=None,
          help="Spark master URL for a session hvd_magic starts (when none is active).")
@argument("--env", action="append", default=[], metavar="NAME=VALUE",
          help="Environment variable for every rank (repeatable). OMP_NUM_THREADS=N: "
               "each rank's CPU threads (default: its share of its host's cores).")
@argument("--min-np", type=int, default=None, metavar="M",
          help="An elastic session: a rank process (or Spark executor) that is lost "
               "no longer ends the session; the next cell runs on the survivors (their "
               "namespaces kept, Horovod reset to the smaller ring). Lost ranks are not "
               "replaced; fewer than M left ends the session.")
@argument("--elastic-api", choices=("horovod", "torch"), default=None,
          help="With --min-np: horovod (Horovod's ring reset before the next cell; the default "
               "where Horovod is installed) or torch (the torch.distributed group re-formed "
               "before the next cell: docs/elastic_ddp.md).")
@argument("--debug", action="store_true",
          help="A rank whose cell raises is held in pdb at its exception (the others wait "
               "before their next Horovod collective): the cell opens it, or %%horovod_debug for a "
               "background cell; c or q lets it go, and the cell ends with its error.")
@argument("--ship", type=str, default=None, metavar="NAMES",
          help="On a cluster, the packages the session's cells will import, sent to executors "
               "that lack them (hvd_magic always goes): mylib,other.")
@argument("--idle-timeout", type=float, default=None,
          help="Seconds idle before the ranks are stopped (default: "
               "HorovodMagics.session_idle_timeout, 3600; 0: never).")
def horovod_session(magics, line):
    """Keep N ranks alive between cells, each with its own namespace: a warm session.

    ::

        %horovod_session start --np -2

        %%horovod
        import torch, horovod.torch as hvd
        hvd.init()
        model = torch.nn.Linear(4, 1)         # still there in the next cell

        %horovod_session stop

    While a session is active, every ``%%horovod`` cell without placement options runs on
    its ranks at once (no start-up), in each rank's own namespace: what a cell assigns on
    the ranks is there for the next cell, Horovod stays initialised (``hvd.init()`` again is
    harmless). Notebook values a cell reads are sent fresh with every cell, and so are those
    read by the functions it uses that an earlier session cell defined (and by the functions
    those use): after ``lr = 0.5`` in the notebook, ``train(60)`` trains at 0.5, as in one
    process. A name the ranks assigned themselves wins over the notebook's value of the same
    name. An error
    keeps the session; Cancel or Ctrl-C interrupts the cell on every rank (a
    KeyboardInterrupt) and keeps the state. A rank that dies breaks the session:
    ``restart`` starts a new one. ``stop``, the kernel's exit and the idle limit end every
    rank.

    With ``--min-np M`` the session is elastic (on Spark each rank is a plain task of its
    own, not a barrier stage): a rank process or executor that is lost (killed, out of
    memory) leaves the others running with their namespaces.
    A cell running at that moment ends with a message saying so (run it again), unless its
    code is inside ``hvd.elastic.run``, which recovers by itself. Before the next cell the
    survivors reset Horovod (``hvd.shutdown(); hvd.init()``): ``hvd.size()`` and
    ``hvd.rank()`` are the smaller ring's. Lost ranks are not replaced: what they held is
    gone, and the session goes on with fewer ranks until fewer than M are left.

    Examples
    --------
    ::

        %horovod_session start --np 2         # on Spark executors: 2 barrier tasks held
        %horovod_session                      # ranks, hosts, idle time, memory per rank
        %horovod_session restart              # after a rank died
        %horovod_session start --np -4 --min-np 2   # elastic: survives lost ranks
        %horovod_session start --np -2 --debug      # an error holds its rank in pdb
    """
    args = parse_argstring(magics.horovod_session, line)
    session = magics._active_session()
    if args.action == "status":
        if session is None:
            return print("No session. Start one: %horovod_session start --np 2")
        return print(status(session))
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
                   "min_np": args.min_np, "debug": args.debug, "elastic_api": args.elastic_api,
                   "env": env_option(args.env), "ship": args.ship,
                   "idle_timeout": magics.session_idle_timeout if args.idle_timeout is None
                   else args.idle_timeout}
    if not options:
        raise UsageError("No session to restart. Start one: %horovod_session start --np 2")
    Placement(options["np"], min_np=options.get("min_np"))  # a UsageError before "starting"
    print(f"starting a warm session of {abs(options['np'])} ranks "
          f"({'on the driver' if options['np'] < 0 else 'on Spark executors'})…", flush=True)
    magics.session = api.start_session(
        options["np"], master=options["master"], spark_conf=dict(magics.spark_conf),
        horovod_env=dict(magics.horovod_settings), env=options["env"],
        idle_timeout=options["idle_timeout"] or None, min_np=options.get("min_np"),
        debug=options.get("debug", False), elastic_api=options.get("elastic_api"),
        ship=options.get("ship"))
    magics.session.options = options
    for note in magics.session.launcher.take_notes():
        print(f"[hvd_magic] {note}")
    print(status(magics.session))


def status(session):
    """What ``%horovod_session`` says of `session`: its state, ranks, cells and idle time; an
    elastic one's last rings and lost ranks; each live rank's host, pid and memory."""
    state = "stopped" if session.stopped else "broken" if session.broken else \
        "running a cell" if session.busy else "idle"
    idle = time.monotonic() - session.last_used
    ranks = plural(session.np, "rank") if not session.lost else \
        f"{len(session.live)} of {session.np} ranks"
    lines = [f"session {session.id}: {state}, {ranks} on {session.where}, "
             f"{plural(session.cells, 'cell')}"
             + (f", idle {idle:.0f} s" if state == "idle" else "")]
    if session.elastic is not None:
        lines.append(f"  elastic: goes on with at least {session.elastic[0]} ranks; lost ranks "
                     "are not replaced" + "".join(
                         f"; ring of {len(slots)} at {_clock(when)}"
                         for when, slots in session.rings[-3:]))
        lines += [f"  rank {r} lost at {_clock(info['time'])} ({info['how']}, pid {info['pid']})"
                  for r, info in sorted(session.lost.items())]
    if session.broken and not session.stopped:
        lines.append(f"  {session.broken}: %horovod_session restart")
    if os.path.isdir(session.folder):
        lines.append(f"  what the ranks printed between cells: {session.folder}")
    for rank in session.live:
        info = session.ranks.get(rank, {})
        memory = _rss(info.get("pid")) if info.get("host") == socket.gethostname() else None
        lines.append(f"  rank {rank}: {info.get('host', '?')} pid {info.get('pid', '?')}"
                     + (f", {memory / 2**20:.0f} MiB" if memory else ""))
    return "\n".join(lines)


def _clock(when):
    return time.strftime("%H:%M:%S", time.localtime(when))


def _rss(pid):
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.Error, TypeError, ValueError):
        return None
