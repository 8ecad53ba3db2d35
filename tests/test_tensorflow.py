"""TensorFlow and Keras on real ranks: the HorovodRunner-era Keras code runs as written through
`HorovodRunner(np=2)`, `HorovodRunner(np=-2)` and `%%horovod --np 2`, and leaves the same weights
on both ranks; horovod.tensorflow and horovod.torch work in one installation.

TensorFlow takes 3-12 s to import on a rank here, so each run is one small model, one epoch.
"""

import numpy as np
import pytest

import hvd_magic

pytest.importorskip("tensorflow", reason="make setup installs TensorFlow")

# As the Databricks examples write it (`import keras`, `horovod.keras`, Adadelta scaled by size,
# to_categorical, the broadcast callback, Keras' progress on rank 0 only). Each rank trains on its
# own data, so identical weights at the end show that the gradients were averaged, not only that
# the start was broadcast. It also returns its weights and which Keras `import keras` gave.
SEEDS_TRAIN = """\
def train(epochs=3, batch_size=32):
    import numpy as np
    import keras
    import horovod.keras as hvd
    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(128, 8)).astype("float32")
    y = keras.utils.to_categorical((x[:, 0] + x[:, 1] > 0).astype("int64"), 2)
    model = keras.Sequential([keras.layers.Dense(8, activation="relu", input_shape=(8,)),
                              keras.layers.Dense(2, activation="softmax")])
    opt = hvd.DistributedOptimizer(keras.optimizers.Adadelta(1.0 * hvd.size()))
    model.compile(loss=keras.losses.categorical_crossentropy, optimizer=opt, metrics=["accuracy"])
    model.fit(x, y, batch_size=batch_size, epochs=epochs,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)],
              verbose=1 if hvd.rank() == 0 else 0)
    score = model.evaluate(x, y, verbose=0)
    return score, [w.tolist() for w in model.get_weights()], keras.__name__
"""


def assert_trained_in_step(results):
    assert len(results) == 2
    (score0, weights0, keras0), (score1, weights1, keras1) = results
    assert keras0 == keras1 == "tf_keras"  # `import keras` gave Keras 2 on the ranks
    assert len(score0) == 2 and 0.0 <= score0[1] <= 1.0  # [loss, accuracy]
    assert len(weights0) == 4
    for a, b in zip(weights0, weights1):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)
    assert score0 != score1  # each rank evaluated its own data: the shards really differed


@pytest.mark.parametrize("np_", [2, -2], ids=["spark", "driver-only"])
def test_seeds_keras_code_runs_unchanged_through_horovod_runner(ip, fresh_ns, np_):
    ip.run_cell("from hvd_magic import HorovodRunner\n" + SEEDS_TRAIN).raise_error()
    ip.run_cell(f"result = HorovodRunner(np={np_}, quiet=True).run(train, epochs=1)").raise_error()
    results = hvd_magic.last_run().results
    assert fresh_ns["result"] == results[0]  # rank 0's return value
    assert_trained_in_step(results)


def test_seeds_keras_code_runs_unchanged_in_a_cell(ip, fresh_ns):
    ip.run_cell(SEEDS_TRAIN).raise_error()
    value = ip.run_cell_magic("horovod", "--np 2 --quiet", "train(epochs=1)")
    results = hvd_magic.last_run().results
    assert value == results[0]
    assert_trained_in_step(results)
    logs = [open(f"{hvd_magic.last_run().run_dir}/rank-{r}.log").read() for r in (0, 1)]
    assert "loss:" in logs[0] and "loss:" not in logs[1]  # Keras' progress, rank 0 only


BOTH_FRAMEWORKS = """\
import tensorflow as tf, torch
import horovod.tensorflow as hvd_tf, horovod.torch as hvd_torch
import horovod.tensorflow.keras  # Keras 2 wrappers import beside torch
hvd_tf.init()
hvd_torch.init()
tf_sum = hvd_tf.allreduce(tf.constant([hvd_tf.rank() + 1.0]), op=hvd_tf.Sum).numpy().tolist()
torch_sum = hvd_torch.allreduce(torch.tensor([hvd_torch.rank() + 1.0]), op=hvd_torch.Sum).tolist()
(tf_sum, torch_sum, hvd_tf.gloo_built(), tf.keras.layers.Dense.__module__.split(".")[0])
"""


def test_tensorflow_and_torch_allreduce_in_one_installation(ip):
    value = ip.run_cell_magic("horovod", "--np 2 --quiet", BOTH_FRAMEWORKS)
    assert hvd_magic.last_run().results == [value, value]
    tf_sum, torch_sum, gloo, keras_package = value
    assert tf_sum == [3.0] and torch_sum == [3.0] and gloo
    assert keras_package != "keras"  # tf.keras is Keras 2 (TF_USE_LEGACY_KERAS=1), not Keras 3


def test_env_turns_keras_3_back_on(ip):
    value = ip.run_cell_magic("horovod", "--np -1 --quiet --env TF_USE_LEGACY_KERAS=0",
                              "import keras\n(keras.__name__, keras.__version__.split('.')[0])")
    assert value == ("keras", "3")


def test_keras_fits_a_dataframe_shard_through_tf_dataset(ip, fresh_ns):
    from conftest import spark_session

    spark = spark_session(2)
    fresh_ns["df"] = spark.range(0, 600, 1, 2).selectExpr(
        "cast(rand(1) as float) as a", "cast(rand(2) as float) as b").selectExpr(
        "a", "b", "cast(a + b > 1 as int) as label")
    value = ip.run_cell_magic("horovod", "--np 2 --data df --equal-shards --quiet", """\
import keras, hvd_magic
import horovod.keras as hvd
hvd.init()
data = hvd_magic.tf_dataset(32, (["a", "b"], "label"), epochs=20, seed=hvd.rank())
model = keras.Sequential([keras.layers.Dense(1, activation="sigmoid", input_shape=(2,))])
model.compile(loss="binary_crossentropy", metrics=["accuracy"],
              optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.05)))
steps = hvd_magic.shard().num_rows // 32 + 1
model.fit(data, epochs=20, steps_per_epoch=steps, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
(model.evaluate(hvd_magic.tf_dataset(64, (["a", "b"], "label"), shuffle=False), verbose=0)[1],
 [w.tolist() for w in model.get_weights()])
""")
    results = hvd_magic.last_run().results
    assert value[0] > 0.85                             # learnt a + b > 1, not chance
    for a, b in zip(results[0][1], results[1][1]):     # in step on both ranks
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)
