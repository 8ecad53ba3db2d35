"""The terminal command: ``python -m hvd_magic --np 4 train.py args`` (installed as ``hvd-run``).

For the jobs that leave the notebook (CI, scheduled training): the same run as ``%horovod
train.py`` (`hvd_magic.frontends.script`), shown by the text view on the terminal. Its exit code
is the run's: 0 when every rank ended well, the script's own code when a rank called
``sys.exit(N)``, 1 for another failure, 124 on --timeout, 130 when Ctrl-C stopped every rank,
2 for a bad command line.

Not for: anything a notebook shows (widgets), or options of a cell (--export, --data).
"""

import argparse
import os
import sys

DESCRIPTION = """\
Run a Python training script on NP Horovod ranks, as `horovodrun -np NP python train.py ARGS`
would: each rank runs the file as __main__ with sys.argv set. NP > 0: one Spark barrier stage of
NP tasks (an embedded local[NP] session, or the cluster at --master); NP < 0: -NP processes of
this machine, no Spark. Every rank's output is shown as [rank k] lines and kept in
hvd_runs/<run id>/rank-<k>.log."""

EPILOG = """\
examples:
  hvd-run -np 4 train.py --epochs 3
  hvd-run -np 8 --master spark://head:7077 train.py
  hvd-run -np -2 --timeout 600 train.py          # 2 processes here, no Spark
  hvd-run -np -3 --min-np 2 train.py             # elastic: a lost rank is replaced
  python -m hvd_magic --np 2 --mlflow exp train.py

exit code: 0 when every rank succeeded; the script's code when a rank called sys.exit(N);
1 for another failure; 124 after --timeout; 130 after Ctrl-C (every rank is stopped)."""

EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT, EXIT_INTERRUPTED = 1, 2, 124, 130


def parser():
    p = argparse.ArgumentParser(prog=os.path.basename(sys.argv[0]) if sys.argv[0].endswith(
        "hvd-run") else "python -m hvd_magic", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--version", action="version",
                   version=f"hvd_magic {__import__('hvd_magic').__version__}")
    p.add_argument("-np", "--np", "-n", type=int, default=2, dest="np",
                   help="Number of ranks (default 2). Negative: that many processes on this "
                        "machine, without Spark.")
    from .options import ELASTIC_OPTIONS
    for flags, spec in ELASTIC_OPTIONS:  # %%horovod's own, checked by the same code
        p.add_argument(*flags, **spec)
    p.add_argument("--master", metavar="URL",
                   help="Spark master URL (spark://host:7077, yarn, local[N]...); default: an "
                        "embedded local session with enough slots.")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="A Spark setting of the session this command starts (repeatable).")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="Stop every rank after this many seconds.")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="Environment variable for every rank (repeatable). OMP_NUM_THREADS=N: "
                        "each rank's CPU threads (default: its share of its host's cores).")
    p.add_argument("--timeline", action="store_true",
                   help="Record a Horovod timeline on rank 0 (hvd_runs/<run id>/timeline.json).")
    p.add_argument("--name", help="A label for the run.")
    p.add_argument("--ship", metavar="NAMES",
                   help="On a cluster, what goes to executors that lack it: hvd_magic and the "
                        "packages the script imports (default), 'none', or names a,b.")
    p.add_argument("--retries", type=int, default=0,
                   help="Let Spark re-attempt the barrier stage this many times (default 0).")
    p.add_argument("--stall-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="Seconds some ranks may wait in a collective (allreduce, broadcast, "
                        "join, barrier...) while others are not in it (they ended, are still in "
                        "hvd.init(), or run other code) before the watchdog reports a stall; a "
                        "wait in hvd.init() for a peer that never calls it is reported after "
                        "this many seconds, kept between 10 and 30 (default 60).")
    p.add_argument("--pdb", action="store_true",
                   help="When a rank fails, open pdb on its frames, with their locals as the "
                        "rank had them (bounded reprs for large values).")
    p.add_argument("--on-stall", choices=("warn", "fail"), default="warn",
                   help="What a stall does (default: warn).")
    p.add_argument("--mlflow", nargs="?", const=True, default=None, metavar="EXPERIMENT",
                   help="Log the run to MLflow (MLFLOW_TRACKING_URI): params, rank 0's "
                        "reported metrics, the script, the run folder, the status; in a new run "
                        "of EXPERIMENT (default: the current experiment). Needs mlflow.")
    p.add_argument("--run-root", default="hvd_runs", metavar="DIR",
                   help="Where run folders go (default hvd_runs).")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="Show no rank output, only errors.")
    p.add_argument("--verbose", action="store_true",
                   help="Show the Spark JVM's start-up output and C++ libraries' INFO lines.")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="script.py [args ...]",
                   help="The script and its arguments (everything after the script's path is "
                        "the script's, options too).")
    return p


def main(argv=None):
    """Parse the command line, run the script, return the exit code."""
    from IPython.core.error import UsageError

    from ..errors import RankError, RunCancelled, RunTimeout
    from .options import elastic_kwargs, env_option, mlflow_before_script
    from ..view import TextView
    from .script import run_script

    p = parser()
    args = p.parse_args(mlflow_before_script(sys.argv[1:] if argv is None else argv))
    if not args.command:
        p.error("the script to run is missing, e.g.: hvd-run -np 2 train.py --epochs 3")
    before = _spark_context()
    try:
        run_script(args.command[0], args.command[1:], args.np, master=args.master,
                   spark_conf={k: v for k, v in (_conf(item) for item in args.conf)},
                   timeout=args.timeout or None, env=env_option(args.env),
                   timeline=args.timeline, name=args.name, retries=args.retries, ship=args.ship,
                   stall_timeout=args.stall_timeout or None, on_stall=args.on_stall,
                   run_root=args.run_root, view=TextView(quiet=args.quiet, verbose=args.verbose),
                   verbose=args.verbose, mlflow=args.mlflow, **elastic_kwargs(args))
        return 0
    except UsageError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RankError as exc:
        print("\n".join(exc._render_traceback_()), file=sys.stderr)
        if args.pdb and exc.rank_traceback is not None:
            import pdb
            pdb.post_mortem(exc.rank_traceback)  # the rank's frames (driver/postmortem.py)
        code = exc.info.get("exit_code")
        return code if isinstance(code, int) and 0 < code < 256 else EXIT_FAILED
    except RunTimeout as exc:
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    except (RunCancelled, KeyboardInterrupt) as exc:
        print(f"{p.prog}: {exc or 'interrupted'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        _stop_spark(before)


def _conf(item):
    from IPython.core.error import UsageError
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise UsageError(f"--conf takes KEY=VALUE (e.g. spark.executor.memory=4g), not {item!r}.")
    return key, value


def _spark_context():
    """The SparkContext this process runs now, or None (without importing pyspark)."""
    if "pyspark" not in sys.modules:
        return None
    from ..compat import pyspark as pyspark_compat
    return pyspark_compat.active_context()


def _stop_spark(before=None):
    """End the Spark session the run started, and its JVM, with the run; one that was there
    before (`main` called inside a notebook or a program) is theirs and goes on."""
    context = _spark_context()
    if context is None or context is before:
        return
    from pyspark.sql import SparkSession

    from ..compat import pyspark as pyspark_compat
    session = SparkSession.getActiveSession() or pyspark_compat.instantiated_session()
    # (the session's stop also forgets it, so a later SparkSession.builder starts afresh)
    (session if session is not None else context).stop()


def run():
    """The console script's entry point (``hvd-run``) and ``python -m hvd_magic``'s."""
    sys.exit(main())
