"""Driver-only runs (no Spark at all) and background runs, in real processes and a real kernel."""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import ALLREDUCE_CELL, start_kernel

DRIVER_ONLY_SCRIPT = textwrap.dedent("""
    import sys
    from IPython.testing.globalipapp import start_ipython
    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    import hvd_magic
    values = []
    for np in (-2, -4):
        values.append(ip.run_cell_magic("horovod", f"--np {np} --text", sys.argv[1]))
        values.append(hvd_magic.last_run().results)
        values.append(hvd_magic.last_run().where)
    spark_loaded = "pyspark" in sys.modules
    from pyspark import SparkContext   # importable, but no context was ever made
    print("RESULT", repr(values), SparkContext._active_spark_context is None, spark_loaded)
""")


def test_driver_only_runs_never_create_a_spark_context(tmp_path):
    out = subprocess.run([sys.executable, "-c", DRIVER_ONLY_SCRIPT, ALLREDUCE_CELL],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT")][0]
    assert line == ("RESULT [3.0, [3.0, 3.0], 'driver only', 10.0, [10.0, 10.0, 10.0, 10.0], "
                    "'driver only'] True False")
    assert "[rank 3] rank 3 of 4: 10.0" in out.stdout


@pytest.fixture
def kernel(tmp_path):
    env = dict(os.environ, HVD_MAGIC_NO_WIDGETS="1")
    km, kc = start_kernel(tmp_path, env)
    try:
        yield kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def execute(kc, code, timeout=120):
    """Run code in the kernel; return (status, text it printed or returned)."""
    msg_id = kc.execute(code)
    text = []
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text.append(content["text"])
        elif kind in ("execute_result", "display_data"):  # (a Run shows itself as a display)
            text.append(content["data"].get("text/plain", ""))
        elif kind == "error":
            text.append("\n".join(content["traceback"]))
        elif kind == "status" and content["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)
    return reply["content"]["status"], "".join(text)


def test_two_background_runs_and_a_cell_while_they_run(kernel):
    assert execute(kernel, "%load_ext hvd_magic\nimport hvd_magic")[0] == "ok"
    cell = ("%%horovod --np {np} --background --quiet\n"
            "import time, torch, horovod.torch as hvd\nhvd.init()\n"
            "time.sleep(8)\n"
            "hvd.allreduce(torch.tensor([hvd.rank() + {base}]), op=hvd.Sum).item()\n")
    status, shown = execute(kernel, cell.format(np=2, base=10.0))
    assert status == "ok" and "<Run " in shown
    status, shown = execute(kernel, cell.format(np=-2, base=1.0))
    assert status == "ok" and "<Run " in shown
    # a third cell runs at once, while both runs are still going
    status, shown = execute(kernel, "[r.state for r in hvd_magic.runs()[-2:]], 6 * 7")
    assert status == "ok"
    assert shown.strip() == "(['running', 'running'], 42)"
    status, shown = execute(kernel, "[r.wait(timeout=120) for r in hvd_magic.runs()[-2:]]")
    assert status == "ok", shown
    assert shown.strip() == "[[21.0, 21.0], [3.0, 3.0]]"
    # isolated: their own run folders, channels and logs
    status, shown = execute(kernel, "len({r.run_dir for r in hvd_magic.runs()}), "
                                    "[r.state for r in hvd_magic.runs()]")
    assert shown.strip() == "(2, ['done', 'done'])"
