"""The IPython magics: ``%%horovod`` and ``%horovod_timeline``.

A thin shell: parse the options, capture the cell, call `hvd_magic.api.run_cell`, show the result.
Defaults are traitlets, so ``%config HorovodMagics.np = 4`` changes them for the session.
"""

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import Dict, Float, Int, Unicode



@magics_class
class HorovodMagics(Magics):
    np = Int(2, help="Ranks when --np is not given.").tag(config=True)
    timeout = Float(0.0, help="Seconds before a run is stopped (0: no limit).").tag(config=True)
    spark_conf = Dict(help="Spark settings for a session hvd_magic starts itself.").tag(config=True)
    run_root = Unicode("hvd_runs", help="Folder for run folders (logs, timeline).").tag(config=True)
    broadcast_mb = Float(4.0, help="Values larger than this travel by Spark broadcast.").tag(config=True)
    stall_timeout = Float(60.0, help="Default of --stall-timeout, in seconds.").tag(config=True)
    horovod_settings = Dict(help="Extra HOROVOD_* settings for every rank.").tag(config=True)
    session_idle_timeout = Float(
        3600.0, help="Seconds a warm session may sit idle before its ranks are stopped "
                     "(0: never).").tag(config=True)

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell=shell, **kwargs)
        self.session = None          # the warm session (%horovod_session start), if any

    def _active_session(self):
        return self.session if self.session is not None and not self.session.stopped else None

    @magic_arguments()
    @argument("--np", "-n", type=int, default=None,
              help="Number of ranks. N > 0: a Spark barrier stage of N tasks (the active "
                   "SparkSession, or an embedded local[N] one). -N: N processes on the driver "
                   "only, no Spark. Default: HorovodMagics.np (2).")
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
    @cell_magic
    def horovod(self, line, cell):
        """Run this cell on N Horovod ranks; its value is rank 0's last expression.

        The cell runs as a function on every rank: the notebook's imports that it uses are
        re-imported there, and the notebook values it reads are sent by value. Each rank's output
        is shown live, labelled by rank, and kept in full in hvd_runs/<run id>/rank-<k>.log.
        Every rank's value is in ``hvd_magic.last_run().results``.

        Examples
        --------
        ::

            %%horovod --np 4
            import torch, horovod.torch as hvd
            hvd.init()
            total = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)
            total.item()

            %%horovod --np -2 --export model
            model = train()          # model is set in the notebook afterwards

            %%horovod --np 2 --timeout 600 --quiet
            long_training()
        """
        args = parse_argstring(self.horovod, line)
        from .cells import run_cell
        return run_cell(self, args, cell)

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
              help="Environment variable for every rank (repeatable).")
    @argument("--idle-timeout", type=float, default=None,
              help="Seconds idle before the ranks are stopped (default: "
                   "HorovodMagics.session_idle_timeout, 3600; 0: never).")
    @line_magic
    def horovod_session(self, line):
        """Keep N ranks alive between cells: a warm session.

        While a session is active, every ``%%horovod`` cell without placement options runs on
        its ranks at once (no start-up), in each rank's own namespace: what a cell assigns on
        the ranks is there for the next cell, Horovod stays initialised (``hvd.init()`` again is
        harmless). Notebook values a cell reads are sent fresh with every cell, but a name the
        ranks assigned themselves wins over the notebook's value of the same name. An error
        keeps the session; Cancel or Ctrl-C interrupts the cell on every rank (a
        KeyboardInterrupt) and keeps the state. A rank that dies breaks the session:
        ``restart`` starts a new one. ``stop``, the kernel's exit and the idle limit end every
        rank.

        Examples
        --------
        ::

            %horovod_session start --np 2
            %horovod_session                      # ranks, hosts, idle time, memory per rank

            %%horovod
            import torch, horovod.torch as hvd
            hvd.init()
            model = torch.nn.Linear(4, 1)         # still there in the next cell

            %horovod_session stop
        """
        from .session_magic import session_magic
        return session_magic(self, line)

    @magic_arguments()
    @argument("run", nargs="?", default=None,
              help="The run: its id, or the end of it (default: the latest run of this kernel "
                   "with TensorBoard logs).")
    @argument("--path", action="store_true", help="Return the logs' folder instead.")
    @line_magic
    def horovod_tensorboard(self, line):
        """Show the TensorBoard logs the ranks of a run wrote, in TensorBoard's notebook view.

        On the ranks, write to ``hvd_magic.tensorboard_dir()``; each rank's folder comes back
        when it ends, as ``rank-<k>/`` under the run folder's ``tensorboard/`` (or ``--tensorboard
        DIR``), so TensorBoard shows the ranks side by side.

        Examples
        --------
        ::

            %%horovod --np 2
            from torch.utils.tensorboard import SummaryWriter
            writer = SummaryWriter(hvd_magic.tensorboard_dir())
            writer.add_scalar("loss", 0.5, 1)
            writer.close()

            %horovod_tensorboard                 # TensorBoard on the latest run's logs
            %horovod_tensorboard --path          # the folder, rank-0/ and rank-1/ inside
        """
        from .tensorboard_magic import tensorboard_magic
        return tensorboard_magic(self, line)

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
        """Show the Horovod timeline of a run: a link to the file, how to open it, a picture.

        Rank 0's timeline comes back to the run folder as hvd_runs/<run id>/timeline.json when
        the run ends (also when it failed or was cancelled), if the run recorded one: with
        ``%%horovod --timeline`` (the whole run), or ``with hvd_magic.timeline():`` around a few
        steps inside the cell. The picture has a lane per tensor and Horovod's phases
        (NEGOTIATE_ALLREDUCE, QUEUE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE...) as coloured spans;
        Perfetto (ui.perfetto.dev) or chrome://tracing open the file itself.

        Examples
        --------
        ::

            %%horovod --np 2 --timeline
            train(steps=20)

            %horovod_timeline                    # the latest run's timeline, drawn
            %horovod_timeline --summary          # where the time went, per tensor and operation
            %horovod_timeline --list             # runs that have a timeline
            path = %horovod_timeline 3f2a --path # the file of the run whose id ends in 3f2a
        """
        from .timelines.show import timeline_magic
        return timeline_magic(self, line)

    @magic_arguments()
    @argument("--timeout", type=float, default=120.0,
              help="Seconds the probe job may wait for its task slots (default 120).")
    @argument("--text", action="store_true",
              help="Print a plain-text table (to paste into an issue) instead of returning "
                   "the report.")
    @line_magic
    def horovod_env(self, line):
        """Compare every executor's Python packages and GPUs with the driver's.

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
        from .launch.envcheck import check
        args = parse_argstring(self.horovod_env, line)
        if args.timeout <= 0:
            raise UsageError("--timeout takes a positive number of seconds.")
        report = check(timeout=args.timeout)
        if args.text:
            print(report.text())
            return None
        return report
