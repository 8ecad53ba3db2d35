"""Elastic Keras, driver-only: a cell written with Horovod's Keras elastic API (`KerasState`, the
commit / batch / epoch callbacks, ``@hvd.elastic.run`` around ``fit``) survives a rank process
SIGKILLed mid-training (real TensorFlow, real Horovod elastic, a real kill)."""

import os
import signal
import time

import importlib.util

import numpy as np
import pytest

import hvd_magic
from conftest import cancelled_if_running

# (find_spec: importing TensorFlow in the test process would cost seconds and ~500 MB)
pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None,
                                reason="make setup installs TensorFlow")

EPOCHS, BATCHES = 6, 4

# The optimizer's slots are built before hvd.elastic.run (Horovod #2652: a joiner whose
# optimizer has no slots yet broadcasts fewer variables than the others; without the build
# line this run hung once and ended with every rank aborted (SIGABRT) another time). `optimizer.build` is no collective, unlike a first fit step, so a
# replacement rank may run it while the others are in the ring. `epochs=epochs - state.epoch`,
# as Horovod's examples write it: `UpdateEpochStateCallback` adds this fit's epochs to the
# count it began from, so `initial_epoch=state.epoch` would count the earlier ones twice.
KERAS_CELL = """\
import time
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
import hvd_magic

hvd.init()
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(batches * 8, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
tf.keras.utils.set_random_seed(0)
model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(4,))])
optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.01))
model.compile(loss="mse", optimizer=optimizer)
optimizer.build(model.trainable_variables)
state = hvd.elastic.KerasState(model, batch=0, epoch=0)
starts = []

class Report(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        hvd_magic.report(step=state.epoch * batches + batch + 1, total=epochs * batches)
        time.sleep(0.2)

@hvd.elastic.run
def train(state):
    starts.append((state.epoch, state.batch))
    model.fit(x, y, batch_size=8, epochs=epochs - state.epoch, verbose=0,
              callbacks=[hvd.elastic.UpdateEpochStateCallback(state),
                         hvd.elastic.UpdateBatchStateCallback(state),
                         hvd.elastic.CommitStateCallback(state, batches_per_commit=2), Report()])

train(state)
{"epoch": state.epoch, "starts": starts, "weights": [w.tolist() for w in model.get_weights()]}
"""


def test_a_keras_run_with_the_elastic_callbacks_survives_a_killed_rank(ip, fresh_ns):
    """Horovod's Gloo timeout is hvd_magic's default (60 s), as a user's run has it, not a
    shorter one: it also bounds the survivors' wait, in the new ring's `init()`, for the
    replacement to reach its own, and the replacement is started only then (Horovod's driver
    starts it once the survivors are ready), so it imports TensorFlow and builds its model
    meanwhile: over 10 s on a loaded machine, and a Gloo store that times out in `init()`
    aborts every survivor (SIGABRT) and with them the run. The dead rank itself is noticed at
    once (its connections reset)."""
    fresh_ns.update(epochs=EPOCHS, batches=BATCHES)
    run = ip.run_cell_magic("horovod", "--np -3 --min-np 2 --background --quiet", KERAS_CELL)
    with cancelled_if_running(run):
        victim = run.ranks[1]
        deadline = time.monotonic() + 180
        while (victim.step or 0) < BATCHES + 2 and run.state == "running":
            assert time.monotonic() < deadline, "rank 1 never reached its second epoch"
            time.sleep(0.05)
        assert run.state == "running", (run.state, run.error)
        pid = victim.pid
        os.kill(pid, signal.SIGKILL)  # a real kill, mid-training (its second epoch)
        results = run.wait(240)

    assert run.state == "done"
    assert len(results) >= 2
    assert all(r["epoch"] == EPOCHS for r in results)  # every epoch completed
    for r in results[1:]:  # the finishing ranks are in step
        for a, b in zip(results[0]["weights"], r["weights"]):
            np.testing.assert_allclose(np.array(a), np.array(b), rtol=0, atol=1e-6)
    # the survivors went back to a commit and on: not before the epoch the kill came in (every
    # epoch's end is a commit)
    restarts = results[0]["starts"][1:]
    assert restarts and restarts[0][0] >= 1, results[0]["starts"]
    lost = next(c for c in run.membership if c["t"] == "lost")
    assert lost["rank"] == 1 and lost["pid"] == pid and lost["code"] == -signal.SIGKILL
    sizes = [c["size"] for c in run.membership if c["t"] == "ring"]
    assert sizes[0] == 3 and 2 in sizes, sizes
    assert hvd_magic.last_run() is run and not run.unended()
