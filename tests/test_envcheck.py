"""Issue 7: ``%horovod_env`` compares every executor's packages with the driver's.

The cluster test gives one of two standalone workers a different Python environment (a venv
with nothing but cloudpickle 3.0.0): executors inherit their worker's environment, and
PYSPARK_PYTHON is a wrapper that runs ``$HVD_TEST_PYTHON`` when that is set.
"""

import json
import stat
import subprocess
import sys

import cloudpickle
import pytest
from IPython.core.error import UsageError

from conftest import StandaloneCluster
from hvd_magic.launch import envcheck, envreport
from hvd_magic.frontends.magics import HorovodMagics

OTHER_CLOUDPICKLE = "3.0.0"
OTHER_WORKER_HOST = "127.0.0.2"

# Runs a pickled probe in an interpreter where `import hvd_magic` fails, as on an executor that
# lacks it; PySpark's cloudpickle is importable there, as on any executor.
UNPICKLE_WITHOUT_HVD_MAGIC = (
    "import json, pickle, sys\n"
    "sys.modules['hvd_magic'] = None\n"
    "probe = pickle.loads(sys.stdin.buffer.read())\n"
    "print(json.dumps(probe()[0]['values']))\n")


def test_the_probe_runs_where_hvd_magic_cannot_be_imported():
    from pyspark import cloudpickle as spark_cloudpickle
    data = spark_cloudpickle.dumps(envcheck._portable(envcheck.probe))
    assert b"hvd_magic.launch.envcheck" not in data  # the code travels, not a reference to our module
    out = subprocess.run([sys.executable, "-c", UNPICKLE_WITHOUT_HVD_MAGIC], input=data,
                         capture_output=True, check=True).stdout
    values = json.loads(out)
    assert values["hvd_magic"] == "missing"
    assert values["cloudpickle"] == cloudpickle.__version__
    assert values["python"] == sys.version.split()[0]


def test_mismatches_and_what_they_mean():
    driver = envreport.EnvRow("driver", "d", "/py", {
        "python": "3.11.7", "cloudpickle": "3.1.2", "torch": "2.13.0", "horovod": "0.28.1",
        "horovod_gloo": "yes", "horovod_nccl": "no", "hvd_magic": "0.1.0", "pyspark": "4.3.0"})
    same = envreport.EnvRow("10.0.0.1:1", "a", "/py", dict(driver.values, spark_gpus="0,1",
                                                         cuda_device_count="0",
                                                         hostname_address="127.0.1.1"))
    other = envreport.EnvRow("10.0.0.2:2", "b", "/py", dict(
        driver.values, cloudpickle="3.0.0", torch="missing", horovod="missing", horovod_gloo="",
        horovod_nccl="", hvd_magic="missing"))
    mismatches, notes = envreport.compare(driver, [same, other])
    assert sorted((m.where, m.what, m.value, m.driver) for m in mismatches) == [
        ("10.0.0.2:2", "cloudpickle", "3.0.0", "3.1.2"),
        ("10.0.0.2:2", "horovod", "missing", "0.28.1"),
        ("10.0.0.2:2", "hvd_magic", "missing", "0.1.0"),
        ("10.0.0.2:2", "torch", "missing", "2.13.0")]
    text = "\n".join(notes)
    assert "commonest cause of a cell that unpickles on the driver but not on the workers" in text
    assert "needs torch on every executor" in text and "10.0.0.2:2" in text
    assert "GPUs 0,1 but torch sees no GPU" in text  # Spark gives GPUs that torch cannot use
    # a hostname that resolves to loopback on a networked executor (Gloo's fallback address)
    assert "10.0.0.1:1: this executor's hostname resolves to 127.0.1.1" in text
    assert "10.0.0.2:2: this executor's hostname" not in text

    report = envreport.EnvReport("spark://x", driver, [same, other], mismatches, notes)
    assert "3.0.0 !" in report.text() and "4 mismatches" in report.text()
    html = report._repr_html_()
    assert "title='driver: 3.1.2'>3.0.0</td>" in html and "background" in html


def test_an_executor_python_error_is_told_in_one_line():
    spark_text = (
        "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 "
        "failed: org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
        '  File "/x/pyspark.zip/pyspark/worker.py", line 1, in main\n'
        "pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in "
        "worker has different version (3, 10) than that in driver 3.11.\n"
        "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(x.scala:1)\n")
    assert envcheck._spark_error(RuntimeError(spark_text)) == (
        "pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in "
        "worker has different version (3, 10) than that in driver 3.11.")


def test_bad_options_are_usage_errors(ip):
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("horovod_env", "--no-such-option")
    assert type(info.value) is UsageError
    with pytest.raises(UsageError) as info:
        ip.run_line_magic("horovod_env", "--timeout 0")
    assert "--timeout" in str(info.value)


def test_help_is_generated_with_examples():
    doc = HorovodMagics.horovod_env.__doc__
    assert "Examples" in doc and "%horovod_env --text" in doc
    assert "--timeout" in doc and "--text" in doc  # the options, from magic_arguments


def test_without_a_session_only_the_driver_is_reported(ip):
    from pyspark import SparkContext
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    report = ip.run_line_magic("horovod_env", "")
    assert [r.where for r in report.rows] == ["driver"]
    assert report.driver.values["cloudpickle"] == cloudpickle.__version__
    assert "No active SparkSession" in report.text()


# --- a real cluster whose second worker runs another Python environment --------------------------

def wait_for_slots(sc, n, timeout=60):
    """Until both executors have registered (what a user's running session has)."""
    from hvd_magic.launch.spark import SparkLauncher
    SparkLauncher(slot_wait=timeout)._check_slots(sc, n)


@pytest.fixture(scope="module")
def two_environments(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("envcheck")
    other = tmp / "other-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(other)], check=True)
    other_python = str(other / "bin" / "python")
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", other_python, "install",
                          "--quiet", f"cloudpickle=={OTHER_CLOUDPICKLE}"],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        pytest.skip(f"could not install cloudpickle=={OTHER_CLOUDPICKLE} into a second venv "
                    f"(no package index?): {pip.stderr.strip()[-300:]}")
    wrapper = tmp / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec "${{HVD_TEST_PYTHON:-{sys.executable}}}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    cluster = StandaloneCluster(str(tmp), worker_hosts=("127.0.0.1", OTHER_WORKER_HOST),
                                worker_envs={1: {"HVD_TEST_PYTHON": other_python}}).start()
    try:
        session = cluster.session(python=str(wrapper))
        wait_for_slots(session.sparkContext, 4)
        yield cluster, other_python
        session.stop()
    finally:
        cluster.stop()


def test_an_executor_with_other_packages_is_flagged(ip, two_environments, capsys):
    cluster, other_python = two_environments
    report = ip.run_line_magic("horovod_env", "")
    assert report.master == cluster.url
    assert len(report.executors) == 2, report.text()
    # every slot ran the probe (2 workers x 2 cores), grouped into one row per executor
    assert sorted(r.tasks for r in report.executors) == [2, 2]
    by_python = {r.executable: r for r in report.executors}
    # the executors inherited their worker's environment: one runs the other venv's Python
    assert set(by_python) == {sys.executable, other_python}, report.text()
    odd, usual = by_python[other_python], by_python[sys.executable]
    assert odd.values["cloudpickle"] == OTHER_CLOUDPICKLE
    assert odd.values["torch"] == odd.values["horovod"] == odd.values["hvd_magic"] == "missing"
    assert usual.values == report.driver.values

    found = {(m.where, m.what): (m.value, m.driver) for m in report.mismatches}
    assert found[(odd.where, "cloudpickle")] == (OTHER_CLOUDPICKLE, cloudpickle.__version__)
    assert found[(odd.where, "torch")][0] == "missing"
    assert found[(odd.where, "horovod")][0] == "missing"
    assert not [m for m in report.mismatches if m.where == usual.where]
    assert "commonest cause" in report.text()

    html = report._repr_html_()
    assert f"title='driver: {cloudpickle.__version__}'>{OTHER_CLOUDPICKLE}</td>" in html

    assert ip.run_line_magic("horovod_env", "--text") is None
    printed = capsys.readouterr().out
    assert f"{OTHER_CLOUDPICKLE} !" in printed and "missing !" in printed
    assert f"{odd.where}: cloudpickle {OTHER_CLOUDPICKLE} (driver: {cloudpickle.__version__})" \
        in printed
