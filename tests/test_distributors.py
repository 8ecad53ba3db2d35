"""The drop-ins: pyspark's `TorchDistributor` and spark-tensorflow-distributor's
`MirroredStrategyRunner` on real ranks (their calls as written for the originals), and their
argument checks, said before anything starts."""

import pytest
from IPython.core.error import UsageError

import hvd_magic
from hvd_magic import MirroredStrategyRunner, TorchDistributor

from tf_reference import WORKER_DATA, assert_fitted_as_one_process

pytest.importorskip("torch")

# As written for pyspark: env:// from torchrun's variables, positional and keyword arguments.
TOTAL = """\
def total(scale, offset=0.0):
    import os
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    x = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(x)
    dist.destroy_process_group()
    return x.item() * scale + offset, os.environ["CUDA_VISIBLE_DEVICES"]
"""

SCRIPT = """\
import sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
x = torch.tensor([1.0])
dist.all_reduce(x)
print(f"argv={sys.argv[1:]} world={x.item():.0f}")
"""


@pytest.mark.parametrize("local_mode", [True, False], ids=["local", "spark"])
def test_torch_distributor_runs_a_function_and_returns_rank_0s_value(ip, fresh_ns, local_mode):
    ip.run_cell(TOTAL).raise_error()
    fresh_ns["local_mode"] = local_mode
    ip.run_cell("from hvd_magic import TorchDistributor\n"
                "value = TorchDistributor(num_processes=2, local_mode=local_mode, use_gpu=False,\n"
                "                         quiet=True).run(total, 10, offset=1)").raise_error()
    run = hvd_magic.last_run()
    assert fresh_ns["value"] == (31.0, "")  # (1 + 2) * 10 + 1; use_gpu=False hides every GPU
    assert run.results == [(31.0, ""), (31.0, "")]
    assert run.np == 2 and (run.where == "driver only") == local_mode


def test_torch_distributor_runs_a_script_with_its_arguments(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    assert TorchDistributor(2, use_gpu=False, quiet=True).run(str(path), "--lr", 0.5) is None
    run = hvd_magic.last_run()
    for rank in (0, 1):
        assert "argv=['--lr', '0.5'] world=2" in open(run.log_path(rank)).read()


def test_a_failing_process_raises_its_own_traceback():
    def fails():
        import os
        if os.environ["RANK"] == "1":
            raise ValueError("rank one gives up")

    with pytest.raises(hvd_magic.RankError) as info:
        TorchDistributor(2, use_gpu=False, quiet=True).run(fails)
    assert info.value.rank == 1 and "rank one gives up" in str(info.value)


def test_use_gpu_gives_each_local_process_its_own_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")  # (fake GPUs: what CUDA would be told)

    def visible():  # as pyspark's local mode: one list, LOCAL_RANK indexes it
        import os
        return os.environ["CUDA_VISIBLE_DEVICES"], os.environ["LOCAL_RANK"]

    assert TorchDistributor(2, quiet=True).run(visible) == ("4,6", "0")
    assert hvd_magic.last_run().results == [("4,6", "0"), ("4,6", "1")]
    assert [r.gpus for r in hvd_magic.last_run().ranks] == [["4"], ["6"]]
    with pytest.raises(UsageError, match="at most 2 processes"):
        TorchDistributor(3)


@pytest.mark.parametrize("make, message", [
    (lambda: TorchDistributor(0, use_gpu=False), "num_processes has to be a positive integer"),
    (lambda: TorchDistributor(1.5, use_gpu=False), "positive integer"),
    (lambda: TorchDistributor(True, use_gpu=False), "positive integer"),
    (lambda: TorchDistributor(2, local_mode="yes", use_gpu=False), "local_mode takes True or False"),
    (lambda: TorchDistributor(2, use_gpu=False, epochs=3), "unknown option(s) epochs"),
    (lambda: MirroredStrategyRunner(0, use_gpu=False), "num_slots has to be a positive integer"),
    (lambda: MirroredStrategyRunner(2, use_gpu=False, use_custom_strategy=None), "True or False"),
    (lambda: MirroredStrategyRunner(2, gpu_resource_name=""), "gpu_resource_name"),
    (lambda: TorchDistributor(2, use_gpu=False).run(42), "not int"),
    (lambda: TorchDistributor(2, use_gpu=False).run(lambda a: a, 1, 2), "cannot be called with 2"),
    (lambda: TorchDistributor(2, use_gpu=False).run("train.py", lr=1), "no keyword arguments"),
    (lambda: TorchDistributor(2, use_gpu=False).run("missing.py"), "No script 'missing.py'"),
])
def test_bad_arguments_are_refused_before_anything_starts(make, message):
    with pytest.raises(UsageError) as info:
        make()
    assert message in str(info.value)


def test_use_gpu_without_gpus_says_what_to_do(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # this machine: no GPU
    with pytest.raises(UsageError, match="shows none .*use_gpu=False"):
        TorchDistributor(2)  # pyspark's default is use_gpu=True
    with pytest.raises(UsageError, match="'spark.task.resource.gpu.amount' is unset.*use_gpu=False"):
        MirroredStrategyRunner(2, spark_conf={})  # Spark gives the tasks no GPU


# worker_data (tests/tf_reference.py) travels with train, by value, as a notebook's function
KERAS_TRAIN = WORKER_DATA + """\
def train(steps, own=False):
    import json, os
    import tensorflow as tf
    # the runner's strategy, in whose scope this runs; or (use_custom_strategy) our own
    strategy = tf.distribute.MultiWorkerMirroredStrategy() if own else tf.distribute.get_strategy()
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    x, y = worker_data(rank, 16 * steps)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)),
                                     tf.keras.layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.5), loss="binary_crossentropy")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    start = [w.tolist() for w in model.get_weights()]
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16).with_options(options),
              epochs=1, verbose=0)
    return strategy.num_replicas_in_sync, start, [w.tolist() for w in model.get_weights()]
"""


@pytest.mark.parametrize("local_mode, custom", [(False, False), (True, True)],
                         ids=["spark", "local-custom-strategy"])
def test_mirrored_strategy_runner_fits_keras_on_two_slots(ip, fresh_ns, local_mode, custom):
    pytest.importorskip("tensorflow")
    ip.run_cell(KERAS_TRAIN).raise_error()
    fresh_ns.update(local_mode=local_mode, custom=custom)
    ip.run_cell("from hvd_magic import MirroredStrategyRunner\n"
                "value = MirroredStrategyRunner(num_slots=2, local_mode=local_mode, use_gpu=False,\n"
                "                               use_custom_strategy=custom, quiet=True)"
                ".run(train, steps=4, own=custom)").raise_error()
    run = hvd_magic.last_run()
    (replicas0, start, weights0), (replicas1, _, weights1) = run.results
    assert fresh_ns["value"] == run.results[0]  # rank 0's
    assert replicas0 == replicas1 == 2
    assert (run.where == "driver only") == local_mode
    # each rank its own data: the gradients were reduced, as one process fitting them all
    assert_fitted_as_one_process(start, [weights0, weights1])
