"""The IPython magics: ``%%horovod`` (and ``%%distributed``), and the line magics' registration.

A thin shell: parse the options, capture the cell, call `hvd_magic.api.run_cell`, show the result.
Defaults are traitlets, so ``%config HorovodMagics.np = 4`` changes them for the session.
"""

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.utils.process import arg_split
from traitlets import Bool, Dict, Float, Int, Unicode

from .options import elastic_arguments, mlflow_before_script, timeline_arguments
from .sweep_magic import sweep_arguments
from .options import summary_first as _summary_first
from .data_magic import horovod_data
from .debug_magic import horovod_debug
from .env_magic import horovod_env
from .session_magic import horovod_session
from .stacks_magic import horovod_stacks
from .tensorboard_magic import horovod_tensorboard
from .timeline_magic import horovod_timeline
from ..view.opening import Opening



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
    data_cache = Unicode(
        "", help="Where --data DataFrames that are not plain Parquet scans are converted once "
                 "(default: ~/.cache/hvd_magic/data for local[N]; on a cluster, set a "
                 "directory every executor and this notebook share).").tag(config=True)
    fresh = Bool(None, allow_none=True, help=(
        "Default of --fresh: True starts every rank as a new interpreter, False forks it from "
        "the host's template (None: HVD_MAGIC_FRESH, else hvd_magic.config.FRESH_BY_DEFAULT)."
        )).tag(config=True)
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
    @elastic_arguments
    @argument("--data", type=str, default=None, metavar="DF",
              help="A Spark DataFrame of the notebook: each rank reads a disjoint shard of its "
                   "rows from Parquet files (the DataFrame's own when it is a plain Parquet "
                   "scan, else a copy Spark writes once into HorovodMagics.data_cache and "
                   "reuses), with hvd_magic.shard() (in memory) or hvd_magic.numpy_batches / "
                   "torch_batches / tf_dataset (streamed, the same number of batches on every "
                   "rank). In a warm session: for this cell and the next ones.")
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
              help="Environment variable for every rank (repeatable). OMP_NUM_THREADS=N: "
                   "each rank's CPU threads (default: its share of its host's cores). "
                   "HVD_MAGIC_GPU_VIEW=own: each rank sees only its own GPUs, as cuda:0 "
                   "(default: its host's, its own at its local rank; docs/gpus.md).")
    @argument("--retries", type=int, default=0,
              help="Allow Spark to re-attempt the barrier stage this many times (default 0: a "
                   "retried stage is reported, never silently restarted).")
    @argument("--stall-timeout", type=float, default=None,
              help="Seconds some ranks may wait in a collective (Horovod's or "
                   "torch.distributed's: allreduce, broadcast, join, barrier, DDP's backward...) "
                   "while others are not in it (they ended, are still in hvd.init(), or run "
                   "other code) before the hang watchdog reports a stall; ranks waiting in "
                   "hvd.init() (or dist.init_process_group()) for a peer that never calls it "
                   "are reported after this many seconds, kept between 10 and 30. The report "
                   "shows every rank's Python stack, grouped (default: "
                   "HorovodMagics.stall_timeout, 60).")
    @argument("--on-stall", choices=("warn", "fail"), default="warn",
              help="What a stall does: warn (report and keep waiting) or fail (stop the run).")
    @timeline_arguments
    @sweep_arguments
    @argument("--tensorboard", type=str, default=None, metavar="DIR",
              help="Where each rank's TensorBoard logs (what it wrote to "
                   "hvd_magic.tensorboard_dir()) come back, as DIR/rank-<k>/ (default: "
                   "tensorboard/ in the run folder; see %%horovod_tensorboard).")
    @argument("--ship", type=str, default=None, metavar="NAMES",
              help="What a cluster's executors get where they lack it: hvd_magic and the cell's "
                   "packages (never torch, TensorFlow, Horovod unless named), 'none', or a,b.")
    @argument("--fresh", action="store_true", default=None,
              help="Start every rank as a new Python interpreter that imports torch and Horovod "
                   "itself, not forked from the host's template (an interpreter that has "
                   "imported what the cells import of torch, horovod.torch, numpy and pandas; "
                   "never TensorFlow, which is not safe to fork after its import). Default: "
                   "HorovodMagics.fresh, or HVD_MAGIC_FRESH=1 in the notebook's environment; "
                   "else forked: docs/forking.md).")
    @argument("--name", type=str, default=None, help="A label for the run.")
    @argument("--mlflow", nargs="?", const=True, default=None, metavar="EXPERIMENT",
              help="Log the run to MLflow: params, rank 0's reported metrics, the cell (or "
                   "script) and the run folder, its status. Without it, a run is logged only "
                   "when the notebook has an active MLflow run (mlflow.start_run()); with it "
                   "and no active run, to a new run in EXPERIMENT (default: the current "
                   "experiment). Needs mlflow (pip install 'hvd_magic[mlflow]').")
    @argument("--verbose", "-v", action="store_true",
              help="Show what is otherwise only logged: the output of a Spark JVM this run "
                   "starts (kept in hvd_runs/spark-<time>.log either way) and C++ libraries' "
                   "start-up chatter from the ranks: INFO lines, TensorFlow's absl and oneDNN "
                   "notes (kept in the rank logs either way). Default: HorovodMagics.verbose.")
    @argument("command", nargs="...", metavar="script.py [args ...]",
              help="Line magic only: a Python script to run on every rank as __main__, and its "
                   "arguments (everything after the script's path is the script's, options "
                   "too).")
    @line_cell_magic
    def horovod(self, line, cell=None):
        """Run the cell (or a script) on N ranks and show rank 0's last expression.

        ::

            %%horovod --np 2
            import torch, horovod.torch as hvd
            hvd.init()
            hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()

        The ranks run Horovod's code, and every rank also has torchrun's variables
        (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, GROUP_RANK...) and a TF_CONFIG,
        so ``torch.distributed.init_process_group("gloo")`` with no other argument,
        DistributedDataParallel, Lightning, accelerate and tf.distribute work in a cell too;
        ``%%distributed`` is this magic under a name for cells that use no Horovod.

        Each rank is a task of one Spark barrier stage (or, with ``--np -N``, a process of this
        machine). The cell runs as a function on every rank: the notebook's imports that it uses
        are re-imported there, and the notebook values it reads are sent by value. Each rank's
        output is shown live, labelled by rank, and kept in full in the run's folder
        (hvd_runs/<run id>/rank-<k>.log). Every rank's value is in ``last_run().results``.

        The line magic ``%horovod [options] train.py [args]`` runs a script instead, as
        ``horovodrun python train.py args`` would: each rank runs the file as ``__main__`` with
        ``sys.argv`` set; the modules beside it that it imports go with it. ``sys.exit(0)`` on
        every rank is success; a non-zero exit fails that rank (``hvd_magic.run_script`` is the
        same in Python).

        Examples
        --------
        ::

            %%horovod --np -2 --export model
            model = train()          # model is set in the notebook afterwards

            %%horovod --np 2 --timeout 600 --quiet
            long_training()

            %horovod --np 4 train.py --epochs 3   # a training script, as horovodrun runs it

            %%distributed --np 2                 # torch.distributed, as under torchrun
            import torch.distributed as dist
            dist.init_process_group("gloo")
        """
        args = self.horovod.parser.parse_args(mlflow_before_script(arg_split(line)))
        if cell is None and not args.command:
            raise UsageError("%horovod (one %) runs a script: %horovod --np 2 train.py "
                             "--epochs 3. For the code of a cell, use %%horovod (two %).")
        if cell is not None and args.command:
            raise UsageError(f"%%horovod runs the cell below it, not {args.command[0]!r}: for a "
                             f"script, use the line magic %horovod {' '.join(args.command)}.")
        opening = None
        if not (args.quiet or args.text):  # a line under the cell at once, before any import
            session = self._active_session()
            opening = Opening.show(session.np if session else args.np or self.np)
        try:
            if cell is None:
                from .script import script_line
                return script_line(self, args, opening)
            from .cells import run_cell
            return run_cell(self, args, cell, opening)
        finally:
            if opening is not None:  # (the dashboard took its place, or it is emptied)
                opening.clear()

    def distributed(self, line, cell=None):
        return self.horovod(line, cell)

    # %%distributed: %%horovod's options, parser and help, for cells that use no Horovod
    distributed.__doc__ = horovod.__doc__
    distributed.parser = horovod.parser
    distributed = line_cell_magic(distributed)

    horovod_session = line_magic(horovod_session)
    horovod_data = line_magic(horovod_data)
    horovod_tensorboard = line_magic(horovod_tensorboard)
    horovod_env = line_magic(horovod_env)
    horovod_stacks = line_magic(horovod_stacks)
    horovod_debug = line_magic(horovod_debug)
    horovod_timeline = line_magic(horovod_timeline)
