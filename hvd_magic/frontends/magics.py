"""The IPython magics: ``%%horovod`` and ``%horovod_timeline``.

A thin shell: parse the options, capture the cell, call `hvd_magic.api.run_cell`, show the result.
Defaults are traitlets, so ``%config HorovodMagics.np = 4`` changes them for the session.
"""

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Bool, Dict, Float, Int, Unicode

from .options import summary_first as _summary_first
from .session_magic import horovod_session
from .tensorboard_magic import horovod_tensorboard



@magics_class
class HorovodMagics(Magics):
    np = Int(2, help="Ranks when --np is not given.").tag(config=True)
    timeout = Float(0.0, help="Seconds before a run is stopped (0: no limit).").tag(config=True)
    spark_conf = Dict(help="Spark settings for a session hvd_magic starts itself.").tag(config=True)
    run_root = Unicode("hvd_runs", help="Folder for run folders (logs, timeline).").tag(config=True)
    broadcast_mb = Float(4.0, help="Values larger than this travel by Spark broadcast.").tag(config=True)
    stall_timeout = Float(60.0, help="Default of --stall-timeout, in seconds.").tag(config=True)
    horovod_settings = Dict(help="Extra HOROVOD_* settings for every rank.").tag(config=True)
    verbose = Bool(False, help="Default of --verbose: show Spark's start-up output and C++ "
                               "libraries' INFO lines.").tag(config=True)
    session_idle_timeout = Float(
        3600.0, help="Seconds a warm session may sit idle before its ranks are stopped "
                     "(0: never).").tag(config=True)

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        self.session = None          # the warm session (%horovod_session start), if any

    def _active_session(self):
        return self.session if self.session is not None and not self.session.stopped else None

    @_summary_first
    @magic_arguments(name="%horovod")  # the usage line then reads %%horovod, as a cell magic's
    @argument("--np", "-n", type=int, default=None,
              help="Number of ranks. N > 0: a Spark barrier stage of N tasks (the active "
                   "SparkSession, or an embedded local[N] one). -N: N processes on the driver "
                   "only, no Spark. Default: HorovodMagics.np (2).")
    @argument("--min-np", type=int, default=None, metavar="M",
              help="An elastic run (driver only for now: --np -N): a rank process that is lost "
                   "is replaced and the others go on from their last commit, with code written "
                   "for Horovod's elastic API (@hvd.elastic.run, hvd.elastic.TorchState). The "
                   "run ends if fewer than M ranks are left for longer than --elastic-timeout.")
    @argument("--max-np", type=int, default=None, metavar="N",
              help="With --min-np: at most N ranks (default: the ranks of --np).")
    @argument("--elastic-timeout", type=float, default=None, metavar="S",
              help="With --min-np: seconds the run may have fewer than --min-np ranks "
                   "(default 600, Horovod's).")
    @argument("--data", type=str, default=None, metavar="DF",
              help="A Spark DataFrame of the notebook: each rank gets a disjoint shard of its "
                   "rows, made by Spark on the executors (never through the notebook), and "
                   "reads it with hvd_magic.shard() (a memory-mapped pyarrow.Table; "
                   "hvd_magic.torch_batches / tf_dataset make batches of it).")
    @argument("--equal-shards", action="store_true",
              help="With --data: every rank keeps as many rows as the smallest shard has (the "
                   "rest are dropped, and the count is shown), so no rank runs out of batches "
                   "before the others.")
    @argument("--timeout", type=float, default=None,
              help="Stop every rank after this many seconds.")
    @argument("--export", type=str, default="",
              help="Comma-separated names whose final values on rank 0 are set in the notebook.")
    @argument("--quiet", "-q", action="store_true",
              help="Show only the cell's value (and errors), not the ranks' output.")
    @argument("--text", action="store_true",
              help="Plain text output instead of the widget dashboard.")
    @argument("--background", action="store_true",
              help="Return at once with the Run; it keeps going while other cells run.")
    @argument("--master", type=str, default=None,
              help="Spark master URL for a session hvd_magic starts (when none is active).")
    @argument("--env", action="append", default=[], metavar="NAME=VALUE",
              help="Environment variable for every rank (repeatable).")
    @argument("--retries", type=int, default=0,
              help="Allow Spark to re-attempt the barrier stage this many times (default 0: a "
                   "retried stage is reported, never silently restarted).")
    @argument("--stall-timeout", type=float, default=None,
              help="Seconds after some ranks ended while the others still wait before the "
                   "hang watchdog reports a stall, with each waiting rank's stack "
                   "(default: HorovodMagics.stall_timeout, 60).")
    @argument("--on-stall", choices=("warn", "fail"), default="warn",
              help="What a stall does: warn (report and keep waiting) or fail (stop the run).")
    @argument("--timeline", action="store_true",
              help="Record a Horovod timeline on rank 0; it is brought back to the run folder "
                   "as timeline.json (see %%horovod_timeline).")
    @argument("--tensorboard", type=str, default=None, metavar="DIR",
              help="Where each rank's TensorBoard logs (what it wrote to "
                   "hvd_magic.tensorboard_dir()) come back, as DIR/rank-<k>/ (default: "
                   "tensorboard/ in the run folder; see %%horovod_tensorboard).")
    @argument("--name", type=str, default=None, help="A label for the run.")
    @argument("--verbose", "-v", action="store_true",
              help="Show what is otherwise only logged: the output of a Spark JVM this run "
                   "starts (kept in hvd_runs/spark-<time>.log either way) and C++ libraries' "
                   "INFO lines from the ranks (kept in the rank logs either way). Default: "
                   "HorovodMagics.verbose.")
    @cell_magic
    def horovod(self, line, cell):
        """Run the cell on N Horovod ranks and show rank 0's last expression.

        ::

            %%horovod --np 2
            import torch, horovod.torch as hvd
            hvd.init()
            hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()

        Each rank is a task of one Spark barrier stage (or, with ``--np -N``, a process of this
        machine). The cell runs as a function on every rank: the notebook's imports that it uses are
        re-imported there, and the notebook values it reads are sent by value. Each rank's output
        is shown live, labelled by rank, and kept in full in hvd_runs/<run id>/rank-<k>.log.
        Every rank's value is in ``hvd_magic.last_run().results``.

        Examples
        --------
        ::

            %%horovod --np -2 --export model
            model = train()          # model is set in the notebook afterwards

            %%horovod --np 2 --timeout 600 --quiet
            long_training()
        """
        args = parse_argstring(self.horovod, line)
        from .cells import run_cell
        return run_cell(self, args, cell)

    horovod_session = line_magic(horovod_session)
    horovod_tensorboard = line_magic(horovod_tensorboard)

    @_summary_first
    @magic_arguments()
    @argument("run", nargs="?", default=None,
              help="The run: its id, or the end of it (default: the latest run with a timeline, "
                   "of this kernel or in hvd_runs/).")
    @argument("--list", action="store_true",
              help="List the runs that have a timeline: id, start time, np, state, file size.")
    @argument("--path", action="store_true",
              help="Return the path of the run's timeline.json (to open or copy it).")
    @argument("--summary", action="store_true",
              help="Tables of the top tensors and operations: count, total and mean time, "
                   "bytes, share of wall time.")
    @argument("--top", type=int, default=None,
              help="Rows per --summary table (default 10); lanes of the picture (default 16).")
    @line_magic
    def horovod_timeline(self, line):
        """Draw the Horovod timeline of a run, a lane per tensor, with a link to its file.

        Example (two cells)::

            %%horovod --np 2 --timeline
            import torch, horovod.torch as hvd
            hvd.init()
            for step in range(20):
                hvd.allreduce(torch.ones(1000), name="grad")

            %horovod_timeline

        Rank 0's timeline comes back to the run folder as hvd_runs/<run id>/timeline.json when
        the run ends (also when it failed or was cancelled), if the run recorded one: with
        ``%%horovod --timeline`` (the whole run), or ``with hvd_magic.timeline():`` around a few
        steps inside the cell. The picture has a lane per tensor and Horovod's phases
        (NEGOTIATE_ALLREDUCE, QUEUE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE...) as coloured spans;
        Perfetto (ui.perfetto.dev) or chrome://tracing open the file itself.

        Examples
        --------
        ::

            %horovod_timeline                    # the latest run's timeline, drawn
            %horovod_timeline --summary          # where the time went, per tensor and operation
            %horovod_timeline --list             # runs that have a timeline
            path = %horovod_timeline 3f2a --path # the file of the run whose id ends in 3f2a
        """
        from ..timelines.show import timeline_magic
        return timeline_magic(self, line)

    @_summary_first
    @magic_arguments()
    @argument("--timeout", type=float, default=120.0,
              help="Seconds the probe job may wait for its task slots (default 120).")
    @argument("--text", action="store_true",
              help="Print a plain-text table (to paste into an issue) instead of returning "
                   "the report.")
    @line_magic
    def horovod_env(self, line):
        """Compare the Python packages and GPUs of every Spark executor with the driver's.

        ::

            %horovod_env

        A short Spark job with a task in every slot reports, per executor: the Python,
        cloudpickle, torch, TensorFlow, horovod (built against which torch and TensorFlow? with
        Gloo? NCCL?), hvd_magic and pyspark versions, and the GPUs it sees (CUDA_VISIBLE_DEVICES, torch's device count, the GPUs Spark assigns
        its tasks). Values that differ from the driver's are highlighted; a package that an
        executor lacks is reported as missing. Different Python or cloudpickle versions are the
        commonest cause of a cell that unpickles on the driver but not on the workers; a
        Horovod built against another torch or TensorFlow than the installed one gets a note.
        Returns the report (``hvd_magic.launch.envcheck.EnvReport``; its ``mismatches`` list them).

        Examples
        --------
        ::

            %horovod_env                    # a table of the driver and every executor
            report = %horovod_env
            report.mismatches               # [Mismatch(where='10.0.0.7:41234', what='cloudpickle', ...)]
            %horovod_env --text             # plain text, to paste into an issue
        """
        from ..launch.connect import connect_session
        from ..launch.envcheck import check
        args = parse_argstring(self.horovod_env, line)
        if connect_session() is not None:
            raise UsageError("%horovod_env needs a classic SparkSession (it asks every executor "
                             "through the SparkContext), and the active one is Spark Connect.")
        if args.timeout <= 0:
            raise UsageError("--timeout takes a positive number of seconds.")
        report = check(timeout=args.timeout)
        if args.text:
            print(report.text())
            return None
        return report
