"""Sessions the user made in ways pyspark documents, each in a Python process of its own (a
process holds one JVM, whose environment is fixed when it starts):

- ``SparkSession.builder.remote("local[2]")``: a Connect session whose server runs inside this
  process on a classic SparkContext. The Connect session is the one used.
- a session made without ``PYSPARK_PYTHON`` while ``python3`` on PATH is another interpreter (a
  kernel whose virtualenv is not activated): a classic local session and pyspark's in-process
  local Connect server just work (their workers are on this machine and can run ours), with no
  Java trace on stderr, and leave the user's session as it was.
- a session the user made and stopped: its JVM stays, and ours on it has none of its settings.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

CONNECT_LOCAL = r'''
import json, os, sys
os.environ["HVD_MAGIC_NO_WIDGETS"] = "1"
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "hvd_magic")
ip.run_cell("import hvd_magic\nfrom pyspark.sql import SparkSession\n"
            "spark = SparkSession.builder.remote('local[2]').getOrCreate()\n"
            "df = spark.range(10)").raise_error()
import hvd_magic
from pyspark import SparkContext
out = {"classic_context_too": SparkContext._active_spark_context is not None}
out["cell"] = ip.run_cell_magic("horovod", "--np 2 --text", """
import torch, horovod.torch as hvd
hvd.init()
hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum).item()
""")
out["where"] = hvd_magic.last_run().where
out["rows"] = ip.run_cell_magic("horovod", "--np 2 --text --data df", """
import torch, horovod.torch as hvd
hvd.init()
hvd.allreduce(torch.tensor([float(hvd_magic.shard().num_rows)]), op=hvd.Sum).item()
""")
def main(k):
    import horovod.torch as hvd
    hvd.init()
    return k * hvd.size()
out["runner"] = hvd_magic.HorovodRunner(np=2).run(main, k=5)
out["runner_where"] = hvd_magic.last_run().where
ip.run_cell("spark.stop()").raise_error()
print("RESULT " + json.dumps(out))
'''

WRONG_PYTHON = r'''
import json, sys
import hvd_magic
from pyspark.sql import SparkSession

def size():
    import horovod.torch as hvd
    hvd.init()
    return hvd.size()

out = {}
spark = SparkSession.builder.remote("local[2]").getOrCreate()
out["connect_results"] = hvd_magic.run(size, np=2).results
from pyspark import SparkContext
env = SparkContext._active_spark_context._jvm.java.lang.System.getenv()
out["connect_python_after"] = env.get("PYSPARK_PYTHON")
spark.stop()

spark = SparkSession.builder.master("local[2]").getOrCreate()
out["results"] = hvd_magic.run(size, np=2).results
out["python_exec_after"] = spark.sparkContext.pythonExec
spark.stop()
print("RESULT " + json.dumps(out))
'''


def _run(script, tmp_path, env):
    """What the script printed as its RESULT, and its stderr."""
    return _result(_start(script, tmp_path, env))


def _start(script, cwd, env):
    return subprocess.Popen([sys.executable, "-c", script], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _result(proc):
    try:
        stdout, stderr = proc.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        proc.kill()  # (its JVM, left alone, ends with its parent's gateway socket)
        stdout, stderr = proc.communicate()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (stdout[-3000:], stderr[-5000:])
    return json.loads(lines[-1][len("RESULT "):]), stderr


def _env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_CONNECT", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"))}
    # this checkout's hvd_magic, and nothing of this interpreter's site-packages (a system
    # python3 given those would import pyarrow and hide what the test is about)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # pyspark's in-process Connect server (``remote("local[2]")``) listens on 15002, and its
    # client always dials that port: a second suite on this machine would fail to bind it, or
    # its client would reach the first suite's server. pyspark's own switch for suites that run
    # side by side (SPARK-42272): the server takes a port the kernel picks (0), and the client
    # asks that JVM which one it got.
    env["SPARK_TESTING"] = "1"
    env.update(extra)
    return env


def test_connects_local_form_uses_the_connect_session(tmp_path):
    out, _ = _run(CONNECT_LOCAL, tmp_path, _env(PYSPARK_PYTHON=sys.executable))
    assert out["classic_context_too"]  # the form this test is about: a classic context beside
    assert out["cell"] == 3.0
    assert out["where"].startswith("Spark Connect") and "local[2]" in out["where"]
    assert out["rows"] == 10.0  # --data: every row of the Connect DataFrame, on two ranks
    assert out["runner"] == 10 and out["runner_where"].startswith("Spark Connect")


@pytest.mark.skipif(not shutil.which("python3", path="/usr/bin"), reason="no system python3")
def test_workers_on_another_python(tmp_path):
    system = os.path.realpath("/usr/bin/python3")
    if os.path.realpath(sys.executable) == system or subprocess.run(
            [system, "-c", "import pyarrow"], capture_output=True).returncode == 0:
        pytest.skip("the system python3 is this interpreter or has pyarrow")
    path = os.pathsep.join(["/usr/bin", os.path.dirname(shutil.which("java"))])
    out, stderr = _run(WRONG_PYTHON, tmp_path, _env(PATH=path))
    assert out["connect_results"] == [2, 2]        # the in-process Connect server: it just works
    assert out["connect_python_after"] is None     # and its environment is left as it was
    assert out["results"] == [2, 2]                # a classic local session too
    assert out["python_exec_after"] == "python3"   # and the user's session is left as it was
    assert "at org.apache" not in stderr and " ERROR " not in stderr, stderr[-5000:]


OTHER_VENV = r'''
import json
import hvd_magic
from pyspark.sql import SparkSession

def size():
    import horovod.torch as hvd
    hvd.init()
    return hvd.size()

spark = SparkSession.builder.master("local[2]").getOrCreate()
out = {"results": hvd_magic.run(size, np=2).results,
       "python_exec_after": spark.sparkContext.pythonExec}
spark.stop()
print("RESULT " + json.dumps(out))
'''


def test_workers_on_another_venv_of_the_same_base_python(tmp_path, env_without_horovod):
    """PYSPARK_PYTHON names another venv of the same base interpreter (its python a link to the
    same file as ours, without Horovod): a local session's ranks still run this notebook's
    Python, and the user's session is left as it was."""
    out, _ = _run(OTHER_VENV, tmp_path, _env(PYSPARK_PYTHON=env_without_horovod))
    assert out["results"] == [2, 2]
    assert out["python_exec_after"] == env_without_horovod



STOPPED_SESSION = r'''
import json
import hvd_magic
from pyspark.sql import SparkSession

def one():
    return 1

spark = (SparkSession.builder.master("local[4]").config("spark.task.cpus", "4")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.stop()
out = {"results": hvd_magic.run(one, np=2).results, "where": hvd_magic.last_run().where}
ours = SparkSession.getActiveSession()
out["our_task_cpus"] = ours.sparkContext._jsc.sc().getConf().get("spark.task.cpus", None)
ours.stop()
spark = SparkSession.builder.master("local[4]").getOrCreate()
out["user_task_cpus_after"] = spark.sparkContext._jsc.sc().getConf().get("spark.task.cpus", None)
spark.stop()
# a setting only a JVM's launch takes: the unused JVM gives way to one launched with it
hvd_magic.run(one, np=1, spark_conf={"spark.driver.memory": "700m"})
runtime = SparkSession.getActiveSession().sparkContext._jvm.java.lang.Runtime.getRuntime()
out["heap_mb"] = runtime.maxMemory() // 2**20
print("RESULT " + json.dumps(out))
'''

STOPPED_OURS = r'''
import json
import hvd_magic
from pyspark.sql import SparkSession

def one():
    return 1

hvd_magic.run(one, np=2)
SparkSession.getActiveSession().stop()
spark = SparkSession.builder.master("local[2]").config("spark.task.cpus", "2").getOrCreate()
try:
    hvd_magic.run(one, np=3)
    out = {"error": None}
except Exception as exc:
    out = {"error": str(exc)}
out["user_session_kept"] = (SparkSession.getActiveSession() is spark
                            and not spark.sparkContext._jsc.sc().isStopped())
spark.stop()
print("RESULT " + json.dumps(out))
'''


def test_a_stopped_session_leaves_none_of_its_settings_to_the_next(tmp_path):
    """The user's session launched the JVM, with one slot of 4 cores, and was stopped: the JVM
    stays, keeping those settings, and our embedded session on it has only its own (two ranks
    run); the user's next session gets them again, as PySpark gives them. The other way round,
    a session the user makes once ours (which launched the JVM) is stopped is theirs: a run that
    wants more slots than it has (2 cores, 2 per task) is refused, and the session kept."""
    env = _env(PYSPARK_PYTHON=sys.executable)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    procs = [_start(STOPPED_SESSION, tmp_path / "a", env), _start(STOPPED_OURS, tmp_path / "b", env)]
    (theirs_first, _), (ours_first, _) = [_result(proc) for proc in procs]
    assert theirs_first["results"] == [1, 1] and theirs_first["where"].startswith("local[")
    assert theirs_first["our_task_cpus"] is None
    assert theirs_first["user_task_cpus_after"] == "4"
    assert theirs_first["heap_mb"] <= 700  # (Java's own default here: a quarter of 24 GB)
    assert ours_first["error"] is not None
    assert "(local[2], 2 cpus per task) has 1 task slot;" in ours_first["error"]
    assert ours_first["user_session_kept"]
