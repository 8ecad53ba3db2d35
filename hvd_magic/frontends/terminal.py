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
  hvd-run -np 4 --min-np 2 train.py              # elastic: survives lost ranks
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
    p.add_argument("--master", metavar="URL",
                   help="Spark master URL (spark://host:7077, yarn, local[N]...); default: an "
                        "embedded local session with enough slots.")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="A Spark setting of the session this command starts (repeatable).")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="Stop every rank after this many seconds.")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="Environment variable for every rank (repeatable).")
    p.add_argument("--timeline", action="store_true",
                   help="Record a Horovod timeline on rank 0 (hvd_runs/<run id>/timeline.json).")
    p.add_argument("--name", help="A label for the run.")
    p.add_argument("--retries", type=int, default=0,
                   help="Let Spark re-attempt the barrier stage this many times (default 0).")
    p.add_argument("--min-np", type=int, default=None, metavar="M",
                   help="An elastic run (a script written with Horovod's elastic API): a lost "
                        "rank process or Spark executor is replaced and the others go on from "
                        "their last commit; fewer than M ranks for --elastic-timeout ends it.")
    p.add_argument("--max-np", type=int, default=None, metavar="N",
                   help="With --min-np: at most N ranks (default: those of -np).")
    p.add_argument("--elastic-timeout", type=float, default=None, metavar="SECONDS",
                   help="With --min-np: seconds the run may have fewer than M ranks "
                        "(default 600, Horovod's).")
    p.add_argument("--stall-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="Seconds some ranks may wait in a collective that the others left, "
                        "before the watchdog reports a stall (default 60).")
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
    from .options import env_option, mlflow_before_script
    from ..view import TextView
    from .script import run_script

    p = parser()
    args = p.parse_args(mlflow_before_script(sys.argv[1:] if argv is None else argv))
    if not args.command:
        p.error("the script to run is missing, e.g.: hvd-run -np 2 train.py --epochs 3")
    try:
        run_script(args.command[0], args.command[1:], args.np, master=args.master,
                   spark_conf={k: v for k, v in (_conf(item) for item in args.conf)},
                   timeout=args.timeout or None, env=env_option(args.env),
                   timeline=args.timeline, name=args.name, retries=args.retries,
                   stall_timeout=args.stall_timeout or None, on_stall=args.on_stall,
                   run_root=args.run_root, view=TextView(quiet=args.quiet, verbose=args.verbose),
                   verbose=args.verbose, mlflow=args.mlflow, min_np=args.min_np,
                   max_np=args.max_np, elastic_timeout=args.elastic_timeout)
        return 0
    except UsageError as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RankError as exc:
        print("\n".join(exc._render_traceback_()), file=sys.stderr)
        code = exc.info.get("exit_code")
        return code if isinstance(code, int) and 0 < code < 256 else EXIT_FAILED
    except RunTimeout as exc:
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    except (RunCancelled, KeyboardInterrupt) as exc:
        print(f"{p.prog}: {exc or 'interrupted'}", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        _stop_spark()


def _conf(item):
    from IPython.core.error import UsageError
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise UsageError(f"--conf takes KEY=VALUE (e.g. spark.executor.memory=4g), not {item!r}.")
    return key, value


def _stop_spark():
    """This process started the Spark session (if any): end it, and its JVM, with the run."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()


def run():
    """The console script's entry point (``hvd-run``) and ``python -m hvd_magic``'s."""
    sys.exit(main())
