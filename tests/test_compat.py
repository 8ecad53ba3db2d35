"""Other libraries' private APIs (`hvd_magic.compat`): each one's "feature off" path, as a library
version without it would take it (the attribute taken away), says one line once and leaves the
caller working as documented; where the feature is there, it does its work."""

import datetime
import pickle
import sys
import types
import warnings

import pytest

from hvd_magic import compat


@pytest.fixture
def said(monkeypatch, capsys):
    """The lines `compat.unavailable` said during the test (each feature's once-only memory
    fresh for it)."""
    monkeypatch.setattr(compat, "_said", set())

    def lines():
        return [line for line in capsys.readouterr().err.splitlines()
                if line.startswith("hvd_magic: ")]
    return lines


def test_a_feature_off_is_said_in_one_line_once(said):
    assert compat.unavailable("torch", "Flight Recorder", "stall views show Python stacks only")
    assert not compat.unavailable("torch", "Flight Recorder", "stall views show Python stacks only")
    import torch
    assert said() == [f"hvd_magic: Flight Recorder unavailable in torch {torch.__version__}: "
                      "stall views show Python stacks only"]


# --- torch ----------------------------------------------------------------------------------

@pytest.fixture
def group():
    """A real one-rank Gloo default group."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=5))
    yield dist.group.WORLD._get_backend(torch.device("cpu"))
    dist.destroy_process_group()


def test_a_groups_timeout_is_set_through_the_public_call(group, said):
    from hvd_magic.compat import torch as torch_compat

    assert torch_compat.can_set_group_timeout()
    assert torch_compat.set_group_timeout(datetime.timedelta(seconds=77))
    assert group.options._timeout == datetime.timedelta(seconds=77)
    assert said() == []


def test_the_private_timeout_call_keeps_its_future_warning_to_itself(group, said, monkeypatch):
    """torch 2.14 warns on every `_set_pg_timeout` call (a FutureWarning): where only that call
    sets the timeout, the user sees nothing of ours."""
    import torch.distributed as dist
    from hvd_magic.compat import torch as torch_compat

    monkeypatch.delattr(dist.ProcessGroup, "set_timeout")
    original = dist.distributed_c10d._set_pg_timeout

    def warning_set_pg_timeout(timeout, group=None):  # as torch 2.14.1's does
        warnings.warn("torch.distributed.distributed_c10d._set_pg_timeout is deprecated",
                      FutureWarning, stacklevel=2)
        original(timeout, group)

    monkeypatch.setattr(dist.distributed_c10d, "_set_pg_timeout", warning_set_pg_timeout)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch_compat.can_set_group_timeout()
        assert torch_compat.set_group_timeout(datetime.timedelta(seconds=66))
        warnings.warn("the user's own", FutureWarning)  # (still shown: only ours is filtered)
    assert group.options._timeout == datetime.timedelta(seconds=66)
    assert [str(w.message) for w in caught] == ["the user's own"]
    assert said() == []


def test_without_either_timeout_call_an_elastic_group_is_made_with_the_whole_timeout(
        group, said, monkeypatch):
    import torch.distributed as dist
    from hvd_magic.compat import torch as torch_compat

    monkeypatch.delattr(dist.ProcessGroup, "set_timeout")
    monkeypatch.delattr(dist.distributed_c10d, "_set_pg_timeout")
    assert not torch_compat.can_set_group_timeout()
    assert not torch_compat.can_set_group_timeout()
    assert not torch_compat.set_group_timeout(datetime.timedelta(seconds=66))
    assert group.options._timeout == datetime.timedelta(seconds=5)  # as it was made
    [line] = said()
    assert "a process group's timeout set after its making unavailable in torch" in line
    assert "made with the whole timeout" in line


def test_torchs_default_timeout_without_its_private_call(said, monkeypatch):
    import torch.distributed as dist
    from hvd_magic.compat import torch as torch_compat

    assert torch_compat.default_timeout("gloo") == datetime.timedelta(minutes=30)
    assert said() == []
    monkeypatch.delattr(dist.distributed_c10d, "_get_default_timeout")
    assert torch_compat.default_timeout("nccl") == datetime.timedelta(minutes=10)
    assert torch_compat.default_timeout("gloo") == datetime.timedelta(minutes=30)
    [line] = said()
    assert "distributed_c10d._get_default_timeout unavailable in torch" in line


def test_the_group_count_is_set_back_or_said(said, monkeypatch):
    import torch.distributed as dist
    from hvd_magic.compat import torch as torch_compat

    dist.distributed_c10d._world.group_count = 3
    assert torch_compat.restart_group_names()
    assert dist.distributed_c10d._world.group_count == 0
    monkeypatch.delattr(dist.distributed_c10d, "_world")
    assert not torch_compat.restart_group_names()
    assert "distributed_c10d._world.group_count unavailable" in said()[0]


def test_a_rank_without_the_default_store_leaves_at_once(group, said, monkeypatch):
    import torch.distributed as dist
    from hvd_magic.compat import torch as torch_compat
    from hvd_magic.rank import torch_store

    assert torch_compat.default_store() is not None
    monkeypatch.delattr(dist.distributed_c10d, "_get_default_store")
    torch_store.release(timeout=30.0)  # (would wait on the store's counts; returns at once)
    assert torch_compat.default_store() is None
    [line] = said()
    assert "_get_default_store unavailable in torch" in line


def test_aborting_a_group_without_abort_is_said(group, said, monkeypatch):
    import torch.distributed as dist
    from hvd_magic.compat import torch as torch_compat

    monkeypatch.delattr(dist.ProcessGroup, "abort")
    assert not torch_compat.abort_default_group()
    assert "ProcessGroup.abort unavailable in torch" in said()[0]


def test_a_rank_gpu_pin_without_lazy_call_is_said(said, monkeypatch):
    import torch
    from hvd_magic.rank import gpus

    monkeypatch.setenv(gpus.OWN, "0")
    monkeypatch.delattr(torch.cuda, "_lazy_call")
    gpus._pin_torch(torch)
    gpus._pin_torch(torch)
    [line] = said()
    assert "torch.cuda._lazy_call unavailable in torch" in line
    assert "current device" in line


def test_stall_views_without_the_flight_recorder_show_python_stacks_only(group, said,
                                                                         monkeypatch):
    import torch
    import torch.distributed as dist
    from hvd_magic.rank import stacks

    dist.all_reduce(torch.ones(1))
    assert isinstance(stacks.collectives(), list)
    assert said() == []
    monkeypatch.delattr(torch._C._distributed_c10d, "_dump_fr_trace_json")
    assert stacks.collectives() == []
    assert stacks.collectives() == []
    import torch as t
    assert said() == [f"hvd_magic: Flight Recorder unavailable in torch {t.__version__}: "
                      "stall views show Python stacks only"]


# --- TensorFlow ------------------------------------------------------------------------------

def test_a_tensorflow_timeline_without_the_xspace_message_has_no_events(said, monkeypatch):
    from hvd_magic.compat import tensorflow as tf_compat
    from hvd_magic.rank import tf_profile

    monkeypatch.setattr(tf_compat, "XPLANE_MODULES", ("hvd_magic_no_such.xplane_pb2",))
    assert tf_profile.events_of("/nonexistent/host.xplane.pb") == []
    assert tf_profile.events_of("/nonexistent/host.xplane.pb") == []
    [line] = said()
    assert "the profiler's XSpace message (xplane_pb2) unavailable in tensorflow" in line


def test_the_xspace_message_is_found_in_this_tensorflow(said):
    pytest.importorskip("tensorflow")
    from hvd_magic.compat import tensorflow as tf_compat

    assert type(tf_compat.xspace()).__name__ == "XSpace"
    assert said() == []


def test_tensorflows_internal_modules_are_there_or_said(said, monkeypatch):
    tf = pytest.importorskip("tensorflow")
    from hvd_magic.compat import tensorflow as tf_compat
    from hvd_magic.rank import stall

    tf_compat.check_modules(tf)
    assert tf_compat.function_class() is not None
    assert said() == []
    monkeypatch.setattr(tf_compat, "COLLECTIVE_STRATEGY", "tensorflow.python.no_such_strategy")
    monkeypatch.setattr(tf_compat, "FUNCTION_MODULES", ("tensorflow.python.no_such_function",))
    tf_compat.check_modules(tf)
    tf_compat.check_modules(tf)

    class Strategy:  # (its calls are still waits where tf.function's class is not found)
        def run(self):
            return "ran"

    stall._wrap_tf_waits(Strategy)
    stall._wrap_tf_waits(Strategy)
    assert Strategy().run() == "ran" and Strategy.run.__wrapped__.__name__ == "run"
    assert not hasattr(Strategy.run.__wrapped__, "__wrapped__")  # wrapped once
    lines = said()
    assert [line.split(" unavailable in tensorflow ")[0] for line in lines] == [
        "hvd_magic: the multi-worker strategy's module", "hvd_magic: tf.function's class"]


def test_a_keras_without_its_callback_list_module_is_said(said, monkeypatch):
    from hvd_magic.compat import tensorflow as tf_compat

    monkeypatch.setitem(tf_compat.KERAS_CALLBACK_LISTS, "keras", "keras.src.no_such_module")
    tf_compat.check_modules(types.SimpleNamespace(__name__="keras", __version__="3.99"))
    assert said() == ["hvd_magic: Keras' callback list module unavailable in keras 3.99: a "
                      "--timeline of a Keras fit counts no steps"]


# --- ipykernel -------------------------------------------------------------------------------

def control_request(*args):
    return None


def old_kernel():
    """A kernel without ipykernel 7's members: a control thread, no subshells."""
    return types.SimpleNamespace(
        control_handlers={"kernel_info_request": control_request},
        control_thread=types.SimpleNamespace(io_loop=object()), get_parent=lambda channel: {})


def test_a_kernel_without_subshells_has_clicks_wait_for_the_cell(said, monkeypatch):
    from hvd_magic.view import subshell

    monkeypatch.setattr(subshell, "_kernel", old_kernel)
    monkeypatch.setattr(subshell, "_subshells", {})
    assert subshell.route_to_subshell([types.SimpleNamespace(comm=object())]) is None
    assert subshell.route_to_subshell([types.SimpleNamespace(comm=object())]) is None
    [line] = said()
    assert "kernel subshells unavailable in ipykernel" in line
    assert "answer only when the cell ends" in line


def test_without_publish_status_the_control_channel_is_left_alone(said, monkeypatch):
    from hvd_magic.view import subshell

    kernel = old_kernel()
    monkeypatch.setattr(subshell, "_kernel", lambda: kernel)
    restore = subshell.busy_after_control()
    assert kernel.control_handlers == {"kernel_info_request": control_request}  # not wrapped
    restore()
    assert "Kernel._publish_status unavailable in ipykernel" in said()[0]


def test_a_comm_without_subshell_routing_is_said(said):
    from hvd_magic.compat import ipykernel as kernel_compat

    class Comm:
        def _reply_subshell_for(self, data, default):
            return getattr(self, "_reply_subshell_id", default)

    routed = Comm()
    assert kernel_compat.route_comm(routed, "abc")
    assert routed._reply_subshell_for({}, None) == "abc"
    assert said() == []
    assert not kernel_compat.route_comm(object(), "abc")
    assert "a comm's messages routed to a subshell unavailable" in said()[0]


def test_holding_a_subshell_without_its_lock_is_a_no_op(said, monkeypatch):
    from hvd_magic.view import subshell

    kernel = types.SimpleNamespace(shell_channel_thread=types.SimpleNamespace(
        manager=types.SimpleNamespace(_get_subshell=lambda sid: object())))
    monkeypatch.setattr(subshell, "_kernel", lambda: kernel)
    subshell.hold("abc")()
    assert "a subshell's lock unavailable in ipykernel" in said()[0]


# --- IPython ---------------------------------------------------------------------------------

def test_a_cell_is_named_for_ipython_or_said(ip, said, monkeypatch):
    from hvd_magic.errors import cell_filename
    from hvd_magic.frontends.cells import where_in_notebook

    shell = ip
    place = where_in_notebook(shell)
    assert shell.compile._filename_map[cell_filename(place["cell_id"])] == place["cell_id"]
    assert said() == []
    monkeypatch.setattr(shell, "compile", types.SimpleNamespace())
    assert where_in_notebook(shell) == place  # (the run goes on)
    assert "the compiler's cell names (CachingCompiler._filename_map) unavailable in IPython" \
        in said()[0]


# --- cloudpickle -----------------------------------------------------------------------------

def cell_function():
    namespace = {}
    exec(compile("def f():\n    return 1 / 0\n", "<hvd_magic cell 7>", "exec"), namespace)
    return namespace["f"]


def test_a_pickled_function_keeps_its_cells_file_name(said):
    from hvd_magic import payload

    assert pickle.loads(payload.cloud_dumps(cell_function())).__code__.co_filename == \
        "<hvd_magic cell 7>"
    assert said() == []


def test_a_cloudpickle_that_reduces_code_otherwise_is_used_as_it_is(said, monkeypatch):
    import cloudpickle
    from hvd_magic import payload
    from hvd_magic.compat import cloudpickle as pickle_compat

    # (a cloudpickle whose placeholder for a code's file name is not the one we know)
    monkeypatch.setattr(pickle_compat, "PLACEHOLDER", "<some other placeholder>")
    pickle_compat.code_naming_pickler.cache_clear()
    try:
        assert pickle_compat.code_naming_pickler() is cloudpickle.Pickler
        restored = pickle.loads(payload.cloud_dumps(cell_function()))  # (still pickles)
        assert restored.__code__.co_filename == "<dynamic-code>"
    finally:
        pickle_compat.code_naming_pickler.cache_clear()
    [line] = said()
    assert f"code objects' file names in a pickle unavailable in cloudpickle " \
           f"{cloudpickle.__version__}: a rank's traceback does not show the cell's lines" == \
        line.removeprefix("hvd_magic: ")


# --- Horovod's elastic driver ----------------------------------------------------------------

def test_horovods_driver_without_its_private_members(said):
    from hvd_magic.compat import horovod as horovod_compat

    driver = types.SimpleNamespace()
    assert horovod_compat.elastic_timeout(driver) is None
    assert not horovod_compat.wake_slot_wait(driver)
    assert not horovod_compat.remind_hosts_added(driver)
    assert not horovod_compat.break_worker_barrier(driver)
    assert horovod_compat.worker_exit_hook(object) is None
    lines = said()
    assert len(lines) == 5 and all(" unavailable in horovod " in line for line in lines)


def test_horovods_driver_members_do_their_work(said):
    import threading
    from hvd_magic.compat import horovod as horovod_compat

    barrier = threading.Barrier(2)
    driver = types.SimpleNamespace(_timeout=600, _wait_hosts_cond=threading.Condition(),
                                   _worker_registry=types.SimpleNamespace(_barrier=barrier))
    assert horovod_compat.elastic_timeout(driver) == 600
    assert horovod_compat.wake_slot_wait(driver)
    assert horovod_compat.break_worker_barrier(driver)
    assert barrier.broken
    before_a_reset = types.SimpleNamespace(_worker_registry=types.SimpleNamespace(_barrier=None))
    assert not horovod_compat.break_worker_barrier(before_a_reset)
    assert said() == []  # (a barrier not made yet is no feature off)


# --- pyspark (no JVM: the Python objects alone) ----------------------------------------------

def test_pysparks_jvm_objects_missing_are_said_and_the_callers_estimate(said, monkeypatch):
    pytest.importorskip("pyspark")
    from pyspark import SparkContext
    from hvd_magic.compat import pyspark as pyspark_compat
    from hvd_magic.launch.spark import cluster_slots, context_conf

    class Context:  # a SparkContext as a PySpark without `_jsc` would have it
        defaultParallelism = 3

        def getConf(self):
            return {"spark.task.cpus": "1"}

    assert cluster_slots(Context()) == 3
    assert context_conf(Context()) == {"spark.task.cpus": "1"}
    assert pyspark_compat.java_dataframe(object()) is None
    assert not pyspark_compat.wrap_python_function(object())
    monkeypatch.delattr(SparkContext, "_lock")
    assert not pyspark_compat.forget_gateway(None)
    lines = said()
    assert [line.split(" unavailable in pyspark ")[0] for line in lines] == [
        "hvd_magic: SparkContext._jsc", "hvd_magic: DataFrame._jdf", "hvd_magic: RDD._jrdd",
        "hvd_magic: SparkContext._gateway"]


def test_without_the_active_context_attribute_none_is_found(said, monkeypatch):
    pytest.importorskip("pyspark")
    from pyspark import SparkContext
    from hvd_magic.compat import pyspark as pyspark_compat

    monkeypatch.setattr(SparkContext, "_active_spark_context", None)  # (none running)
    assert pyspark_compat.active_context() is None
    assert said() == []  # (a private attribute that is None is no feature off)
    monkeypatch.delattr(SparkContext, "_active_spark_context")
    assert pyspark_compat.active_context() is None
    assert "SparkContext._active_spark_context unavailable in pyspark" in said()[0]


def test_a_connect_clients_port_or_said(said):
    from hvd_magic.compat import pyspark as pyspark_compat

    builder = types.SimpleNamespace(_port=15002)
    assert pyspark_compat.connect_port(types.SimpleNamespace(
        client=types.SimpleNamespace(_builder=builder))) == 15002
    assert said() == []
    assert pyspark_compat.connect_port(types.SimpleNamespace(client=object())) is None
    assert "Spark Connect's port (client._builder._port) unavailable in pyspark" in said()[0]


def test_a_connect_plan_is_read_from_explain_without_its_private_call(said):
    from hvd_magic.compat import pyspark as pyspark_compat

    class ConnectFrame:
        def explain(self, extended=False):
            print("== Optimized Logical Plan ==\nRelation [a#1L] parquet\n")

    assert "Relation [a#1L] parquet" in pyspark_compat.explain_text(ConnectFrame())
    assert said() == []


def test_an_executors_broadcast_file_or_said(said, tmp_path):
    pytest.importorskip("pyspark")
    from pyspark.core.broadcast import Broadcast
    from hvd_magic import payload

    path = tmp_path / "broadcast"
    path.write_bytes(pickle.dumps(b"value", protocol=5))
    ref = Broadcast(path=str(path))
    assert payload.for_rank(ref) == {payload.FILE_KEY: str(path)}
    assert said() == []
    bare = Broadcast.__new__(Broadcast)  # a Broadcast whose file is kept elsewhere
    bare._value = b"value"
    assert payload.for_rank(bare) == b"value"
    assert "Broadcast._path unavailable in pyspark" in said()[0]


def test_no_compat_module_imports_its_library_at_import():
    """A rank imports compat/torch.py before the cell imports torch (a cell without torch must
    not pay for it), the notebook side compat/pyspark.py without Spark."""
    import subprocess

    libraries = ("torch", "tensorflow", "pyspark", "py4j", "ipykernel", "IPython", "horovod",
                 "mlflow", "cloudpickle")
    modules = ("torch", "tensorflow", "pyspark", "ipykernel", "ipython", "cloudpickle",
               "horovod", "mlflow")
    code = (f"import sys\nfor name in {libraries!r}:\n    sys.modules[name] = None\n"
            + "".join(f"import hvd_magic.compat.{m}\n" for m in modules))
    subprocess.run([sys.executable, "-c", code], check=True)
