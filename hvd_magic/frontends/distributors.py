"""Drop-ins for the launchers people move off Horovod with: pyspark's `TorchDistributor` (and
its `DeepspeedTorchDistributor`) and spark-tensorflow-distributor's `MirroredStrategyRunner`,
with their constructors and ``run`` meanings, on hvd_magic's launcher.

What they get beside the originals: the live dashboard (``[rank k]`` lines in a script), every
rank's full log in the run folder, the failing rank's own traceback (`hvd_magic.RankError`), the
run stopped as soon as one rank fails, Ctrl-C, ``timeout=``, every rank's value in
``hvd_magic.last_run().results``. The ranks get torchrun's variables and a ``TF_CONFIG``
(`hvd_magic.frameworks`), so the same training code runs unchanged.

Not for: anything the ranks run (`hvd_magic.rank.strategy` makes the strategy there), or options
of the run in ``run()``: as in the originals, ``run``'s arguments go to the training code, so the
run's options (``timeout``, ``env``, ``text``...) go to the constructor, as `HorovodRunner`'s do.
"""

import json
import os
import tempfile

from IPython.core.error import UsageError

from .. import api
from .horovod_runner import OPTIONS, check_call, shown
from ..rank.deepspeed_setup import CONFIG as DEEPSPEED_CONFIG
from .script import script_job

__all__ = ["TorchDistributor", "DeepspeedTorchDistributor", "MirroredStrategyRunner"]


def _count(who, name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise UsageError(f"{who}: {name} has to be a positive integer (the number of processes, "
                         f"one rank each), not {value!r}.")
    return value


def _flag(who, name, value):
    if not isinstance(value, bool):
        raise UsageError(f"{who}: {name} takes True or False, not {value!r}.")
    return value


def _options(who, options):
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UsageError(f"{who}() got unknown option(s) {', '.join(unknown)}; beside its own "
                         f"arguments it takes the run's options {', '.join(OPTIONS)}. Arguments "
                         f"for the training code go to .run().")
    return dict(options)


def _gpu_env(who, n, local_mode, use_gpu, options, resource="gpu"):
    """The environment that gives each rank one GPU (nothing: our placement does) or none
    (``CUDA_VISIBLE_DEVICES=""``, as pyspark sets it); a UsageError where the GPUs asked for
    are not there, said before anything starts."""
    if not use_gpu:
        return {"CUDA_VISIBLE_DEVICES": ""}
    cpu = "or pass use_gpu=False to train on the CPU"
    if local_mode:  # ranks on this machine get its GPUs by local rank (launch/local.py)
        from ..launch.local import visible_gpus
        gpus = visible_gpus()
        if len(gpus) < n:
            raise UsageError(f"{who}: use_gpu=True gives each of the {n} processes a GPU of this "
                             f"machine, and it shows {len(gpus) or 'none'} (CUDA_VISIBLE_DEVICES, "
                             f"torch.cuda): ask for at most {len(gpus)} processes, {cpu}."
                             if gpus else
                             f"{who}: use_gpu=True needs a GPU per process, and this machine "
                             f"shows none (CUDA_VISIBLE_DEVICES, torch.cuda); {cpu}.")
        return {}
    if resource != "gpu":
        raise UsageError(f"{who}: the ranks are given Spark's 'gpu' resource; "
                         f"gpu_resource_name={resource!r} is not placed. Name your GPUs 'gpu' "
                         f"in Spark's resources, {cpu}.")
    key = f"spark.task.resource.{resource}.amount"
    amount = _spark_conf(options, key)
    try:
        amount = float(amount or 0)
    except ValueError:
        amount = 0
    if amount < 1:
        raise UsageError(f"{who}: '{key}' is unset, so Spark gives the tasks no GPU and "
                         f"use_gpu=True cannot hold. Set it to 1 (with the executors' GPU "
                         f"resources), {cpu}.")
    return {}


def _spark_conf(options, key):
    """`key` of the SparkSession the run will use: `options`' own, else the active one."""
    if "spark_conf" in options and key in (options["spark_conf"] or {}):
        return str(options["spark_conf"][key])
    spark = options.get("spark")
    if spark is None:
        from pyspark.sql import SparkSession
        spark = SparkSession.getActiveSession()
    return spark.conf.get(key, None) if spark is not None else None


class TorchDistributor:
    """pyspark's ``TorchDistributor`` on hvd_magic: `num_processes` ranks, each with torchrun's
    environment (``init_process_group("gloo")`` / ``"nccl"`` with no other argument, DDP,
    Lightning with ``strategy="ddp", devices=1, num_nodes=num_processes``).

    Parameters
    ----------
    num_processes : int
        How many processes (ranks): a positive integer.
    local_mode : bool
        True: processes on this machine (the driver), no Spark; False: one Spark barrier task
        each (the active SparkSession, or an embedded ``local[N]`` one).
    use_gpu : bool
        True: one GPU per process, from Spark's task resources (``spark.task.resource.gpu.amount``
        must be set) or, in local mode, this machine's GPUs by local rank; refused before
        anything starts where there are none. False: ``CUDA_VISIBLE_DEVICES=""`` on every rank.
    **options
        The run's options, as `HorovodRunner` takes them: ``timeout``, ``env``, ``text``,
        ``quiet``, ``spark``, ``run_dir``, ``name``...

    Examples
    --------
    ::

        def train(lr):
            import torch.distributed as dist
            dist.init_process_group("gloo")
            ...
            return model.state_dict()

        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(train, 1e-3)
        TorchDistributor(2, use_gpu=False).run("train.py", "--lr", "1e-3")    # None
    """

    def __init__(self, num_processes=1, local_mode=True, use_gpu=True, **options):
        who = "TorchDistributor"
        self.num_processes = _count(who, "num_processes", num_processes)
        self.local_mode = _flag(who, "local_mode", local_mode)
        self.use_gpu = _flag(who, "use_gpu", use_gpu)
        self.options = _options(who, options)
        gpu_env = _gpu_env(who, num_processes, local_mode, use_gpu, self.options)
        self.options["env"] = {**gpu_env, **(self.options.get("env") or {})}

    @property
    def np(self):
        """hvd_magic's `np` for these processes: -N on the driver, N on Spark."""
        return -self.num_processes if self.local_mode else self.num_processes

    def run(self, train_object, *args, **kwargs):
        """Run `train_object` on every process: a function is called with `args` and `kwargs`,
        and rank 0's value returned; a path (a ``str``) is run as a script with `args` as its
        command line (strings), and None returned. Raises `hvd_magic.RankError` with the failing
        rank's own traceback; every rank's value is in ``hvd_magic.last_run().results``."""
        if isinstance(train_object, (str, os.PathLike)):
            if kwargs:
                raise UsageError("TorchDistributor.run: a Python file takes no keyword arguments "
                                 "(as in pyspark); pass its command line as strings: "
                                 "run('train.py', '--lr', '0.01').")
            job, _ = script_job(train_object, [str(a) for a in args])
            from ..config import split

            def start(view, **options):
                placement, run_options = split(self.np, **options)
                return api.launch(job, {}, placement, run_options, view=view)

            shown(self.np, self.options, start)
            return None
        check_call(train_object, kwargs, args, who="TorchDistributor.run")
        return shown(self.np, self.options, lambda **options: api.run(
            train_object, self.np, args=args, kwargs=kwargs, **options)).value


class DeepspeedTorchDistributor(TorchDistributor):
    """pyspark's ``DeepspeedTorchDistributor`` on hvd_magic: ``numGpus * nnodes`` ranks, each
    with torchrun's environment, for code that calls ``deepspeed.initialize``.

    Parameters
    ----------
    numGpus : int
        Processes per node (one GPU each with `useGpu`).
    nnodes : int
        Nodes: with `localMode` False, ``numGpus * nnodes`` Spark barrier tasks.
    localMode, useGpu : bool
        As `TorchDistributor`'s ``local_mode`` and ``use_gpu``.
    deepspeedConfig : dict or str
        DeepSpeed's config (a dict, or a JSON file's path). A script gets it as pyspark gives
        it, ``--deepspeed --deepspeed_config PATH`` after its own arguments; a function (where
        pyspark drops it) gets it too: its ``deepspeed.initialize`` called without a config
        takes this one (`hvd_magic.rank.deepspeed_setup`).
    **options
        The run's options, as `TorchDistributor`'s.

    Examples
    --------
    ::

        def train():
            import deepspeed
            engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer)
            ...

        DeepspeedTorchDistributor(numGpus=2, useGpu=False,
                                  deepspeedConfig={"train_micro_batch_size_per_gpu": 4}).run(train)
    """

    def __init__(self, numGpus=1, nnodes=1, localMode=True, useGpu=True, deepspeedConfig=None,
                 **options):
        who = "DeepspeedTorchDistributor"
        processes = _count(who, "numGpus", numGpus) * _count(who, "nnodes", nnodes)
        super().__init__(processes, localMode, useGpu, **options)
        self.deepspeed_config = _deepspeed_config(who, deepspeedConfig)
        if self.deepspeed_config is not None:
            self.options["env"] = {**self.options["env"],
                                   DEEPSPEED_CONFIG: json.dumps(self.deepspeed_config)}

    def run(self, train_object, *args, **kwargs):
        """As `TorchDistributor.run`; a script also gets ``--deepspeed --deepspeed_config``."""
        if isinstance(train_object, (str, os.PathLike)) and self.deepspeed_config is not None:
            folder = tempfile.mkdtemp(prefix="hvd_magic_deepspeed_")
            path = os.path.join(folder, "deepspeed_config.json")
            with open(path, "w") as f:
                json.dump(self.deepspeed_config, f)
            args = (*args, "--deepspeed", "--deepspeed_config", path)
        return super().run(train_object, *args, **kwargs)


def _deepspeed_config(who, config):
    if config is None or isinstance(config, dict):
        return config
    if isinstance(config, (str, os.PathLike)) and os.path.isfile(config):
        with open(config) as f:
            try:
                return json.load(f)
            except ValueError as exc:
                raise UsageError(f"{who}: deepspeedConfig {os.fspath(config)!r} is not JSON "
                                 f"({exc}); pass a dict or a JSON file's path.") from None
    raise UsageError(f"{who}: deepspeedConfig must be a dict or a JSON file's path, not "
                     f"{config!r}.")


class MirroredStrategyRunner:
    """spark-tensorflow-distributor's ``MirroredStrategyRunner`` on hvd_magic: `num_slots` ranks,
    each a worker of one ``tf.distribute`` cluster (its ``TF_CONFIG``), running `fn` inside a
    ``MultiWorkerMirroredStrategy`` scope made first on the rank (unless `use_custom_strategy`:
    then `fn` makes its own strategy from ``TF_CONFIG``).

    Parameters
    ----------
    num_slots : int
        How many ranks (one process each, one GPU each with `use_gpu`).
    local_mode : bool
        True: ranks on this machine (the driver), no Spark; False (default): one Spark barrier
        task each.
    use_gpu : bool
        As `TorchDistributor`'s: one GPU per rank, refused before anything starts where there
        are none; False gives every rank ``CUDA_VISIBLE_DEVICES=""``.
    gpu_resource_name : str
        Spark's name for the GPU resource: ``"gpu"`` (the one placed).
    use_custom_strategy : bool
        False (default): `fn` runs inside the strategy's scope. True: `fn` makes the strategy.
    **options
        The run's options, as `HorovodRunner` takes them (``timeout``, ``env``, ``text``...).

    Examples
    --------
    ::

        def train(epochs):
            import tensorflow as tf
            model = tf.keras.Sequential([...]); model.compile(...)   # in the strategy's scope
            model.fit(dataset, epochs=epochs)
            return model.get_weights()

        MirroredStrategyRunner(num_slots=2, use_gpu=False).run(train, epochs=2)
    """

    def __init__(self, num_slots, local_mode=False, use_gpu=True, gpu_resource_name="gpu",
                 use_custom_strategy=False, **options):
        who = "MirroredStrategyRunner"
        self.num_slots = _count(who, "num_slots", num_slots)
        self.local_mode = _flag(who, "local_mode", local_mode)
        self.use_gpu = _flag(who, "use_gpu", use_gpu)
        self.use_custom_strategy = _flag(who, "use_custom_strategy", use_custom_strategy)
        if not isinstance(gpu_resource_name, str) or not gpu_resource_name:
            raise UsageError(f"{who}: gpu_resource_name takes the name of Spark's GPU resource "
                             f"('gpu'), not {gpu_resource_name!r}.")
        self.gpu_resource_name = gpu_resource_name
        self.options = _options(who, options)
        gpu_env = _gpu_env(who, num_slots, local_mode, use_gpu, self.options, gpu_resource_name)
        self.options["env"] = {**gpu_env, **(self.options.get("env") or {})}

    def run(self, fn, **kwargs):
        """``fn(**kwargs)`` on every rank (in the strategy's scope); rank 0's value. Raises
        `hvd_magic.RankError` with the failing rank's own traceback."""
        check_call(fn, kwargs, who="MirroredStrategyRunner.run")
        np = -self.num_slots if self.local_mode else self.num_slots
        if self.use_custom_strategy:
            call, call_args, call_kwargs = fn, (), kwargs
        else:
            from ..rank.strategy import in_mirrored_strategy
            call, call_args, call_kwargs = in_mirrored_strategy, (fn,), {"kwargs": kwargs}
        return shown(np, self.options, lambda **options: api.run(
            call, np, args=call_args, kwargs=call_kwargs, **options)).value
