"""`hvd_magic.HorovodRunner`, Databricks' API: what it returns, and every call it refuses before
anything starts. Functions are defined in the real IPython shell, as in a notebook, so cloudpickle
sends them (and the globals they read) by value, as it does for a user's."""

import pytest
from IPython.core.error import UsageError

import hvd_magic
from hvd_magic.launch.spark import local_slots


def refusal(ip, code):
    """Run `code` in the shell; the UsageError's message (it must be exactly that class)."""
    with pytest.raises(UsageError) as info:
        ip.run_cell(code).raise_error()
    assert type(info.value) is UsageError  # IPython prints a subclass with a full traceback
    return str(info.value)


def test_runs_on_spark_and_on_the_driver_and_returns_rank0s_value(ip, fresh_ns):
    ip.run_cell("from hvd_magic import HorovodRunner\n"
                "OFFSET = 10\n"
                "def total(scale=1.0):\n"
                "    import torch, horovod.torch as hvd\n"
                "    hvd.init()\n"
                "    t = hvd.allreduce(torch.tensor([hvd.rank() + 1.0]), op=hvd.Sum)\n"
                "    return (hvd.rank(), t.item() * scale + OFFSET)\n").raise_error()
    for np in (2, -2):
        ip.run_cell(f"result = HorovodRunner(np={np}, quiet=True).run(total, scale=2.0)").raise_error()
        assert fresh_ns["result"] == (0, 16.0)
        assert hvd_magic.last_run().results == [(0, 16.0), (1, 16.0)]
        assert (hvd_magic.last_run().where == "driver only") == (np < 0)


def test_log_callback_only_streams_rank0_and_all_streams_every_rank(ip, fresh_ns, capsys):
    ip.run_cell("from hvd_magic import HorovodRunner\n"
                "def hello():\n"
                "    import os\n"
                "    print('hello from', os.environ['HOROVOD_RANK'])\n").raise_error()
    capsys.readouterr()
    ip.run_cell("HorovodRunner(np=-2, text=True).run(hello)").raise_error()
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "hello from 1" not in out
    ip.run_cell("HorovodRunner(np=-2, driver_log_verbosity='all', text=True).run(hello)").raise_error()
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out


REFUSALS = [
    ("np 0", "HorovodRunner(np=0)", ["np must be a non-zero whole number", "-N"]),
    ("np not a number", "HorovodRunner(np='2')", ["non-zero whole number", "'2'"]),
    ("unknown option", "HorovodRunner(np=2, tiemout=5)", ["tiemout", "timeout", ".run(main, **kwargs)"]),
    ("bad verbosity", "HorovodRunner(np=2, driver_log_verbosity='some')",
     ["driver_log_verbosity", "'log_callback_only'", "'all'"]),
    ("not callable", "HorovodRunner(np=2).run(train())", ["not int", "run(train)"]),
    ("keyword it does not take", "HorovodRunner(np=2).run(train, epochs=3, lr=0.1)",
     ["train(epochs=1)", "lr", "unexpected keyword"]),
    ("required argument missing", "HorovodRunner(np=2).run(needs_data)",
     ["needs_data(data, epochs=1)", "missing a required argument: 'data'"]),
    ("unpicklable global", "HorovodRunner(np=2).run(uses_lock)",
     ["`LOCK` (lock)", "create it inside uses_lock()", "no job was started"]),
    ("unpicklable global of a helper", "HorovodRunner(np=2).run(calls_helper)",
     ["`WRITER` (TextIOWrapper)", "open the file inside calls_helper()"]),
    ("unpicklable closure value", "HorovodRunner(np=-2).run(make_closure())",
     ["`lock` (lock)"]),
]
SETUP = """\
import threading
from hvd_magic import HorovodRunner
LOCK = threading.Lock()
WRITER = open(__import__('os').devnull, 'w')
def train(epochs=1):
    return epochs
def needs_data(data, epochs=1):
    return data
def uses_lock():
    with LOCK:
        return 1
def helper():
    WRITER.write('x')
def calls_helper():
    helper()
def make_closure():
    lock = threading.Lock()
    def inner():
        return lock.locked()
    return inner
"""


@pytest.mark.parametrize("name, code, words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_refusals_name_the_problem(ip, fresh_ns, name, code, words):
    ip.run_cell(SETUP).raise_error()
    message = refusal(ip, code)
    for word in words:
        assert word in message, message


def test_refusals_start_no_spark_job(ip, fresh_ns):
    ip.run_cell(SETUP).raise_error()
    ip.run_cell("HorovodRunner(np=2, quiet=True).run(train)").raise_error()  # a warm session
    from pyspark import SparkContext
    store = SparkContext._active_spark_context._jsc.sc().statusStore()
    jobs_before = store.jobsList(None).size()
    for code in ("HorovodRunner(np=2).run(uses_lock)", "HorovodRunner(np=2).run(train, lr=1)"):
        refusal(ip, code)
    assert store.jobsList(None).size() == jobs_before


def test_more_ranks_than_slots_is_refused(ip, fresh_ns):
    ip.run_cell(SETUP + "HorovodRunner(np=2, quiet=True).run(train)").raise_error()
    from pyspark.sql import SparkSession
    session = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
    slots = local_slots(session.sparkContext.master)
    fresh_ns["session"] = session
    message = refusal(ip, f"HorovodRunner(np={slots + 1}, spark=session).run(train)")
    assert f"np={slots + 1}" in message and f"{slots} task slots" in message


SCRIPT = """\
from hvd_magic import HorovodRunner

SCALE = 10

def main(x=1):
    import torch, horovod.torch as hvd
    hvd.init()
    print(f"hello from rank {hvd.rank()}")
    return hvd.allreduce(torch.tensor([float(x)]), op=hvd.Sum).item() * SCALE

if __name__ == "__main__":
    print("result:", HorovodRunner(np=-2, driver_log_verbosity="all").run(main, x=2))
"""


def test_a_plain_python_script_gets_the_text_view(tmp_path):
    import subprocess
    import sys
    (tmp_path / "train.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "[rank 0] hello from rank 0" in done.stdout
    assert "[rank 1] hello from rank 1" in done.stdout
    assert "result: 40.0" in done.stdout
    assert "rank 1" in done.stdout and "done" in done.stdout  # the text view's summary
