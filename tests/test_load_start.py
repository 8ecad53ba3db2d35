"""What ``%load_ext`` starts (issue 80, items 5 and 10): only what the saved notebook's cells will
use (Spark where a cell uses it, sized for the biggest; the kernel's template where a cell runs
--np -N and imports a framework), nothing on a machine too small, one line saying what and how to
turn it off; and a cell bigger than the Spark begun at load starts its own at once, without
waiting for the smaller one, its finished dashboard keeping one account of it.
"""

import os
import time
import types

import nbformat
import pytest

from test_first_cell import everything_shown, java_pids, prestarted_kernel
from test_live_view import Widgets, text_output


def _notebook(path, *cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in ("%load_ext hvd_magic", *cells)]
    nbformat.write(nb, str(path))
    return {"JPY_SESSION_NAME": str(path)}


@pytest.mark.parametrize("cells, spark_np, driver, hold", [
    (["%%horovod --np -2\nimport torch"], None, True, ["numpy", "torch"]),
    (["%%horovod --np 8\nimport torch", "%%distributed -n 2\n1"], 8, False, ["numpy", "torch"]),
    (["%%horovod\nprint(1)"], 2, False, []),                 # the default np (2) is on Spark
    (["from pyspark.sql import SparkSession"], 2, False, []),
    (["%horovod_session start --np 3", "%horovod_session stop"], 3, False, []),
    (["x = hvd_magic.run(f, np=-4)"], None, True, []),
    (["import pandas as pd\npd.DataFrame()", "%pip install torch"], None, False, ["numpy", "pandas"]),
])
def test_what_the_saved_cells_use(tmp_path, cells, spark_np, driver, hold):
    from hvd_magic.frontends.warmup import uses
    environ = _notebook(tmp_path / "n.ipynb", *cells)
    assert uses({}, 2, environ) == (spark_np, driver, hold, True)


def test_a_notebook_that_uses_no_ranks_starts_nothing(tmp_path):
    """A real kernel, as JupyterHub gives one to every notebook that loads the extension."""
    environ = _notebook(tmp_path / "plain.ipynb", "import json\nprint(json.dumps([1]))")
    kernel = prestarted_kernel(tmp_path, **environ)
    try:
        assert "hvd_magic" not in text_output(kernel.load_messages)
        assert kernel.value("hvd_magic.launch.prestart.current() is None")
        assert kernel.value("hvd_magic.frontends.warmup._started is None")  # no template
        assert java_pids(kernel) == []
    finally:
        kernel.close()


def test_a_machine_too_small_starts_nothing_and_says_so(tmp_path, monkeypatch):
    from hvd_magic.frontends import warmup
    from hvd_magic.launch import prestart
    environ = dict(_notebook(tmp_path / "n.ipynb", "%%horovod --np 2\n1"), PATH=os.environ["PATH"])
    magics = types.SimpleNamespace(np=2, spark_conf={}, run_root=str(tmp_path / "hvd_runs"))
    monkeypatch.setattr(warmup, "MIN_AVAILABLE_GB", 10.0 ** 9)  # more than any machine has
    said = warmup.start({}, magics, environ)
    assert said.startswith("hvd_magic: nothing started in the background (") and \
        "GB of memory available, under 1e+09 GB" in said, said
    assert prestart.current() is None and warmup._started is None


def gated_java_for(folder, master):
    """A JAVA_HOME whose java, when launched for `master`, waits for the file `folder`/go (a JVM
    start for that master that lasts until the test says); any other starts at once."""
    java = folder / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    real = os.path.realpath(__import__("shutil").which("java"))
    java.write_text(f"#!/bin/bash\ncase \"$*\" in *'spark.master={master}'*)\n"
                    f"  while [ ! -e {folder / 'go'} ]; do sleep 0.05; done;;\nesac\n"
                    f"exec {real} \"$@\"\n")
    java.chmod(0o755)
    return folder / "jdk", folder / "go"


def test_a_cell_bigger_than_the_spark_begun_at_load_starts_its_own_at_once(tmp_path):
    """local[4] begun at load (the notebook's cells unknown), its JVM held on its way up; a
    --np 5 cell gives it up without waiting, runs on local[5], and its dashboard keeps one
    account (the local[5] it ran on); the held JVM, once up, ends itself."""
    java_home, go = gated_java_for(tmp_path, "local[4]")
    kernel = prestarted_kernel(tmp_path, JAVA_HOME=str(java_home))
    try:
        assert "starting Spark (local[4]" in text_output(kernel.load_messages)
        kernel.execute("import hvd_magic.view.dashboard as d; d.SHOW_AFTER = 0")
        began = time.monotonic()

        def not_waiting_for_the_held_jvm(_msg):  # (the dashboard's clock never lets it idle)
            assert time.monotonic() - began < 240, "the cell waits for the held local[4] JVM"

        reply, messages = kernel.execute("%%distributed --np 5\nimport os\nos.getpid()",
                                         on_message=not_waiting_for_the_held_jvm)
        assert reply["content"]["status"] == "ok", reply["content"]  # (local[4]'s JVM held)
        assert not go.exists()
        shown = everything_shown(messages)
        assert "starting Spark (local[5]: room for 5 ranks); the local[4] begun when " \
               "hvd_magic loaded is too small" in shown
        assert "begun when hvd_magic loaded…" not in shown  # never waited on
        notices = Widgets(messages).html_containing("data-notice")
        assert notices and all("local[4]" not in n for n in notices)
        assert "5 ranks on local[5] share" in notices[-1]
        assert kernel.value("hvd_magic.last_run().state") == "done"
        go.touch()
        deadline = time.monotonic() + 120
        while len(java_pids(kernel)) > 1 and time.monotonic() < deadline:
            time.sleep(0.5)  # (a poll: the JVM ends itself once its launch returns)
        assert len(java_pids(kernel)) == 1
    finally:
        go.touch()
        kernel.close()
