"""Issue 68: `%load_ext hvd_magic` never fails on a broken optional package. A pyspark whose
import fails (py4j half gone: here an empty `py4j` package first on the path, as a broken
upgrade leaves it) gets one line at load, `--np -N` cells run, and a `--np N` cell names the
import error, the Python and what to do."""

import os
import subprocess
import sys

SCRIPT = """\
%load_ext hvd_magic
print("value", get_ipython().run_cell_magic("distributed", "--np -2 --quiet", "1 + 1"))
get_ipython().run_cell_magic("horovod", "--np 2 --quiet", "1 + 1")
"""


def test_a_broken_pyspark_leaves_loading_clean_and_a_spark_cell_says_why(tmp_path):
    (tmp_path / "shadow" / "py4j").mkdir(parents=True)
    (tmp_path / "shadow" / "py4j" / "__init__.py").write_text("")
    cells = tmp_path / "cells.ipy"
    cells.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "IPython", "--no-banner", "--colors=NoColor", str(cells)],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "shadow"),
             "HVD_MAGIC_PRESTART": "1"})
    out = done.stdout + done.stderr
    lines = out.strip().splitlines()
    said = " ".join(out[:out.find("value 2")].split())  # (%load_ext's lines wrap at 96 columns)
    assert said.startswith(
        "hvd_magic: Spark cannot be started early: pyspark fails to import "
        "(ModuleNotFoundError: No module named 'py4j.java_collections'). --np -N cells run "
        "without it; a --np N cell says what to do."), out
    assert "stops Spark first" not in said, out  # (no Spark was started: nothing to stop)
    assert "Traceback" not in out, out
    assert "value 2" in out
    assert ("UsageError: Running 2 ranks as Spark tasks (--np 2) needs pyspark, and it fails to "
            "import in this notebook's Python") in out, out
    assert "No module named 'py4j.java_collections'" in lines[-1] and "--np -2" in lines[-1]
