"""tf.distribute in a %%horovod cell: every rank gets a ``TF_CONFIG`` (one worker per rank, its
own port reserved on its own host), so ``MultiWorkerMirroredStrategy()`` trains a Keras model
across the ranks; real ranks, real gRPC.

TensorFlow takes 3-12 s to import on a rank here: one tiny model, one epoch of four steps.
"""

import pytest

import hvd_magic

from tf_reference import WORKER_DATA, assert_fitted_as_one_process

pytest.importorskip("tensorflow", reason="make setup installs TensorFlow")

# The strategy first (before any other TensorFlow op, as TensorFlow asks), then Keras. Each rank
# trains on its own data; the weights before the fit come back with those after it.
RESULT = ("(strategy.num_replicas_in_sync, rank, start, [w.tolist() for w in model.get_weights()],"
          " keras.__name__)")
MIRRORED_FIT = """\
import json, os, sys
import numpy as np
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
import keras
rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
""" + WORKER_DATA + """\
x, y = worker_data(rank)
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="binary_crossentropy")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
start = [w.tolist() for w in model.get_weights()]
model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16).with_options(options),
          epochs=1, verbose=0)
""" + RESULT + "\n"


def assert_fitted_in_step(results, keras_name):
    """Both workers' weights moved from worker 0's start to where one process fitting the global
    batches gets them (tests/tf_reference.py)."""
    (replicas0, rank0, start, weights0, keras0), (replicas1, rank1, _, weights1, keras1) = results
    assert replicas0 == replicas1 == 2
    assert (rank0, rank1) == (0, 1)  # TF_CONFIG's task index is the rank
    assert keras0 == keras1 == keras_name
    assert_fitted_as_one_process(start, [weights0, weights1])


@pytest.mark.parametrize("line", ["--np -2", "--np 2"])  # on the driver; on Spark local
def test_tf_keras_fits_under_multi_worker_mirrored_strategy(ip, line):
    ip.run_cell_magic("horovod", f"{line} --quiet", MIRRORED_FIT)  # `import keras` is tf_keras
    assert_fitted_in_step(hvd_magic.last_run().results, "tf_keras")


def test_the_watchdog_names_a_rank_waiting_in_a_tf_distribute_collective(ip):
    """Rank 1 sleeps before its fit: rank 0 waits inside its first train step (a tf.function
    whose all-reduce rank 1 never joins); the watchdog says so instead of TensorFlow's wait
    (without it, rank 1 would fit after its sleep and the run end well)."""
    cell = MIRRORED_FIT.replace("model.fit(",
                                "if rank == 1:\n    import time; time.sleep(120)\nmodel.fit(")
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -2 --quiet --stall-timeout 5 --on-stall fail", cell)
    text = "\n".join(info.value._render_traceback_())
    assert "rank 0 has been waiting in a collective (tf.function)" in text, text
    assert "rank 1 is running elsewhere" in text


# Keras 3's fit reduces its first (x, y) batch with `strategy.reduce`, which TensorFlow's
# CollectiveAllReduce cannot do for a nest across workers (keras-team/keras#20585, open): it fails
# before any step, on every launcher. Strict, so the day it works this says so.
@pytest.mark.xfail(raises=hvd_magic.RankError, strict=True,
                   reason="keras-team/keras#20585: Keras 3 fit under a multi-worker strategy")
def test_keras_3_fit_under_multi_worker_mirrored_strategy(ip):
    ip.run_cell_magic("horovod", "--np -2 --quiet --env TF_USE_LEGACY_KERAS=0", MIRRORED_FIT)
    assert_fitted_in_step(hvd_magic.last_run().results, "keras")


# The same fit split over a warm session's cells: the strategy and the model made once in the
# first cell (the session's ranks keep them), trained in each later one.
SETUP, FIT = MIRRORED_FIT.split("options = tf.data.Options()\n")
FIT = "options = tf.data.Options()\n" + FIT


def test_a_warm_session_keeps_its_strategy_across_cells(ip, fresh_ns):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        ip.run_cell_magic("horovod", "--quiet", SETUP)
        first = ip.run_cell_magic("horovod", "--quiet", FIT)
        assert_fitted_in_step(hvd_magic.last_run().results, "tf_keras")
        ip.run_cell_magic("horovod", "--quiet", FIT)
        second = hvd_magic.last_run().results
    finally:
        ip.run_line_magic("horovod_session", "stop")
    assert_fitted_in_step(second, "tf_keras")
    assert second[0][2] == first[3]  # the same model, trained on from where the first fit left it


def test_a_script_through_the_terminal_command(tmp_path):
    """`hvd-run` (here `python -m hvd_magic`) gives a script's ranks their TF_CONFIG too."""
    import json
    import os
    import subprocess
    import sys

    from conftest import ROOT

    (tmp_path / "train.py").write_text(
        MIRRORED_FIT.replace(RESULT, f"json.dump({RESULT}, open(f'out{{rank}}.json', 'w'))"))
    done = subprocess.run([sys.executable, "-m", "hvd_magic", "--np", "-2", "train.py"],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=ROOT), text=True,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    results = [json.loads((tmp_path / f"out{rank}.json").read_text()) for rank in (0, 1)]
    assert_fitted_in_step(results, "tf_keras")


def test_every_rank_gets_its_own_worker_and_no_tensorflow_import(ip):
    cell = ("import json, os, sys\n"
            "(json.loads(os.environ['TF_CONFIG']), 'tensorflow' in sys.modules)\n")
    ip.run_cell_magic("horovod", "--np 2 --quiet", cell)
    (config0, imported0), (config1, imported1) = hvd_magic.last_run().results
    assert not imported0 and not imported1  # nothing of ours imported TensorFlow first
    workers = config0["cluster"]["worker"]
    assert config1["cluster"]["worker"] == workers and len(set(workers)) == 2
    assert [config0["task"], config1["task"]] == [{"type": "worker", "index": 0},
                                                  {"type": "worker", "index": 1}]


def test_a_reserved_port_is_refused_to_others_and_taken_by_a_server_binding_as_grpc_does():
    import socket
    import types

    from hvd_magic.frameworks.tensorflow import TensorFlowDistributed

    held = TensorFlowDistributed().reserve(types.SimpleNamespace(hostname="127.0.0.1"))
    host, port = held.relay["address"].rsplit(":", 1)
    try:
        assert host == "127.0.0.1"
        with socket.socket() as plain, pytest.raises(OSError):
            plain.bind(("", int(port)))  # anyone else: "Address already in use"
        with socket.socket() as server:  # TensorFlow's gRPC server sets SO_REUSEADDR
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("", int(port)))
            server.listen()
    finally:
        held.stop()


def test_the_driver_relays_every_tasks_values_in_rank_order_once_all_are_in():
    from hvd_magic.frameworks import Gathering

    gathering = Gathering(3)
    events = {0: {"relay": {"torch": {"port": 7}}, "own": {"tensorflow": {"address": "a:1"}}},
              2: {"relay": {}, "own": {"tensorflow": {"address": "c:3"}}},
              1: {"relay": {}, "own": {"tensorflow": {"address": "b:2"}}}}
    assert gathering.add(0, events[0]) is None and gathering.add(2, events[2]) is None
    relayed = gathering.add(1, events[1])
    assert relayed == {"torch": {"port": 7},
                       "tensorflow": {"tasks": [{"address": "a:1"}, {"address": "b:2"},
                                                {"address": "c:3"}]}}
    assert gathering.add(1, events[1]) is None  # a stage Spark retried gathers afresh
