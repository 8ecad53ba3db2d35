"""The first impression (issue 21): the first %%horovod cell of a fresh kernel shows only what the
user asked for, says what it waits on while Spark starts, and can be cancelled meanwhile; `make
demo` prints the notebook's output and no warnings.

Each test that needs a first cell starts its own kernel (the JVM starts once per kernel).
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

import cloudpickle
import psutil
import pytest

from conftest import ROOT
from test_live_view import CancelOnShow, Kernel, Widgets, rows, shown_widgets, text_output

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this module

# What a fresh kernel used to show before the cell's own output.
CHATTER = ("Using incubator modules", "Setting default log level", "sc.setLogLevel",
           "without encryption")

FIRST_CELL = """\
%%horovod --np 2
import horovod.torch as hvd
hvd.init()
print(f"rank {hvd.rank()} says hello")
hvd.rank()
"""


def everything_shown(messages):
    """Streams, errors and every state the widgets were ever sent, as one text."""
    parts = [text_output(messages)]
    for msg in messages:
        content = msg["content"]
        if msg["msg_type"] == "error":
            parts.append("\n".join(content["traceback"]))
        elif msg["msg_type"] in ("comm_open", "comm_msg"):
            parts.append(str(content.get("data", {}).get("state", "")))
    return "\n".join(parts)


@pytest.fixture
def fresh_kernel(tmp_path):
    k = Kernel(tmp_path)
    yield k
    k.close()


def kernel_children(kernel):
    """The processes the kernel started (a JVM, Spark's Python workers, ranks) that still run."""
    pid = kernel.value("__import__('os').getpid()")
    return [p for p in psutil.Process(pid).children(recursive=True)
            if p.status() != psutil.STATUS_ZOMBIE]


def test_first_cell_shows_no_start_up_chatter_and_says_it_starts_spark(fresh_kernel):
    widgets = Widgets()
    order = []  # the first time each thing was shown: "starting Spark", then a rank at work

    def on_message(msg):
        widgets.feed(msg)
        html = " ".join(s.get("value", "") for s in widgets.of("HTMLModel").values())
        if "starting Spark (local[" in html + text_output([msg]) and "spark" not in order:
            order.append("spark")
        table = [s["value"] for s in widgets.of("HTMLModel").values() if "<tr data-rank=" in s["value"]]
        if table and any(state in ("running", "done") for state, _, _ in rows(table[0]).values()):
            order.append("ranks") if "ranks" not in order else None

    reply, messages = fresh_kernel.execute(FIRST_CELL, on_message=on_message)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert shown_widgets(messages)  # a Spark start lasts longer than the dashboard's delay
    shown = everything_shown(messages)
    for chatter in CHATTER:
        assert chatter not in shown
    assert "says hello" in shown
    assert order[:2] == ["spark", "ranks"]
    # What Spark's JVM said is kept, in a file next to the run folders.
    [log] = glob.glob(str(fresh_kernel.cwd / "hvd_runs" / "spark-*.log"))
    assert "Setting default log level" in open(log).read()
    [run_dir] = [p for p in (fresh_kernel.cwd / "hvd_runs").iterdir() if p.is_dir()]
    assert json.load(open(run_dir / "run.json"))["spark_log"] == log  # found from the run, too
    # Started in a helper thread, it is still the notebook's active session, as a user's would be.
    assert fresh_kernel.value("__import__('pyspark').sql.SparkSession.getActiveSession() is not None")


CANCEL_CELL = "%%horovod --np 2\nprint('this never runs')\n"


def test_cancel_while_spark_starts_ends_the_cell_and_leaves_no_process(fresh_kernel):
    cancel = CancelOnShow(fresh_kernel)
    reply, messages = fresh_kernel.execute(CANCEL_CELL, on_message=cancel)
    assert "starting Spark (local[" in cancel.shown  # what the user saw when clicking
    widgets = cancel.widgets
    assert reply["content"]["ename"] == "RunCancelled"
    assert "while starting Spark" in reply["content"]["evalue"]
    assert "this never runs" not in text_output(messages)
    assert any("cancelled" in h for h in widgets.html_containing("hvd_magic</b> run"))
    assert fresh_kernel.value("hvd_magic.last_run().state") == "cancelled"
    assert kernel_children(fresh_kernel) == []  # no JVM, no Python worker, no rank
    # and the next cell starts Spark afresh
    reply, messages = fresh_kernel.execute(FIRST_CELL)
    assert reply["content"]["status"] == "ok", reply["content"]
    assert "says hello" in everything_shown(messages)


def test_interrupt_while_spark_starts_then_verbose_shows_the_jvm(fresh_kernel):
    """The kernel's interrupt (its stop button) while Spark starts ends the cell as Cancel does."""
    interrupted = []

    def interrupt_when_shown(msg):
        if not interrupted and "starting Spark (local[" in everything_shown([msg]):
            fresh_kernel.km.interrupt_kernel()
            interrupted.append(msg)

    reply, messages = fresh_kernel.execute(CANCEL_CELL, on_message=interrupt_when_shown)
    assert interrupted and reply["content"]["ename"] == "RunCancelled"
    assert "while starting Spark" in reply["content"]["evalue"]
    assert kernel_children(fresh_kernel) == []

    # The next cell starts Spark afresh; asked to, it shows what the JVM says.
    reply, messages = fresh_kernel.execute(FIRST_CELL.replace("--np 2", "--np 2 --verbose"))
    assert reply["content"]["status"] == "ok", reply["content"]
    assert "says hello" in everything_shown(messages)
    assert "Setting default log level" in text_output(messages)


# -- the session started when the extension loads (`hvd_magic.launch.prestart`) ---------------------

def prestarted_kernel(cwd, **env):
    return Kernel(cwd, env={"HVD_MAGIC_PRESTART": "1", **env})


def java_pids(kernel):
    return [p.pid for p in kernel_children(kernel) if p.name() == "java"]


def gated_java(folder):
    """A JAVA_HOME whose java waits for the file `folder`/go before it starts: a JVM start that
    lasts until the test says (Spark's launcher runs $JAVA_HOME/bin/java)."""
    java = folder / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f"#!/bin/bash\nwhile [ ! -e {folder / 'go'} ]; do sleep 0.05; done\n"
                    f"exec {os.path.realpath(shutil.which('java'))} \"$@\"\n")
    java.chmod(0o755)
    return folder / "jdk", folder / "go"


def test_spark_starts_when_the_extension_loads_and_the_first_cell_finds_it(tmp_path):
    """Spark begun at load, and the kernel's rank template too, holding what the notebook's
    code imports (its file, as Jupyter Server names it to the kernel: a %%horovod cell that
    imports torch): a first --np -2 cell's ranks are forked from it."""
    import nbformat
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("%load_ext hvd_magic"),
                      nbformat.v4.new_code_cell("%%horovod --np -2\nimport os\nif True:\n"
                                                "    %time import torch\nos.getppid()"),
                      nbformat.v4.new_code_cell("%%horovod --np 2\n1")]  # (one on Spark)
    nbformat.write(notebook, str(tmp_path / "first.ipynb"))
    kernel = prestarted_kernel(tmp_path, JPY_SESSION_NAME=str(tmp_path / "first.ipynb"))
    try:
        kernel.execute("import hvd_magic.frontends.warmup as w; w._started.join(300)")
        status = ("__import__('hvd_magic.template.client').template.client.status("
                  "__import__('hvd_magic.task.environ').task.environ.rank_base_env())")
        held = kernel.value(status)
        assert held["modules"] == ["numpy", "torch"], held  # before any cell ran
        reply, messages = kernel.execute(notebook.cells[1].source.replace("%time ", ""))
        assert reply["content"]["status"] == "ok", reply["content"]
        assert kernel.value("hvd_magic.last_run().results") == [held["pid"]] * 2
        lines = text_output(kernel.load_messages).splitlines()
        assert max(map(len, lines)) <= 100, lines  # a notebook does not wrap it: it wraps itself
        said = " ".join(" ".join(lines).split())
        assert "starting Spark (local[4]" in said and ") in the background" in said
        if (os.cpu_count() or 1) < 4:  # more slots than cores: said
            assert f"4 task slots, sharing this machine's {os.cpu_count()} CPU core" in said
        assert "HVD_MAGIC_PRESTART=0" in said  # how to turn it off
        assert kernel.value("hvd_magic.launch.prestart.current().wait() is not None")
        [jvm] = java_pids(kernel)
        began = time.time()
        reply, messages = kernel.execute(FIRST_CELL)
        assert reply["content"]["status"] == "ok", reply["content"]
        shown = everything_shown(messages)
        assert "says hello" in shown and "starting Spark" not in shown  # nothing left to wait for
        # the executor's rank template (the JVM's), begun with Spark before the cell, holding
        # what the notebook imports
        [template] = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [])[
            2:3] == ["hvd_magic.template.server"] and p.info["cmdline"][4] == str(jvm)]
        assert template.create_time() < began
        from hvd_magic.template import client, server
        sock = client._connect(template.cmdline()[3])
        server.send(sock, {"op": "status"})
        assert server.recv(sock)[0]["modules"][:2] == ["numpy", "torch"]
        sock.close()
        assert java_pids(kernel) == [jvm]  # the run kept the session started at load
        [log] = glob.glob(str(tmp_path / "hvd_runs" / "spark-*.log"))
        run_dir = kernel.value("hvd_magic.last_run().run_dir")
        assert json.load(open(os.path.join(run_dir, "run.json")))["spark_log"] == log
        assert kernel.value(
            "__import__('pyspark').sql.SparkSession.getActiveSession() is not None")
    finally:
        kernel.close()


def test_cancel_while_the_start_begun_at_load_goes_on_leaves_no_process(tmp_path):
    java_home, go = gated_java(tmp_path)
    kernel = prestarted_kernel(tmp_path, JAVA_HOME=str(java_home))
    try:
        cancel = CancelOnShow(kernel)

        def cancel_then_let_java_start(msg):
            cancel(msg)
            if cancel.clicked:
                go.touch()  # (a JVM still on its way up cannot be stopped; it is once it is up)

        reply, messages = kernel.execute(CANCEL_CELL, on_message=cancel_then_let_java_start)
        assert "starting Spark (local[4]), begun when hvd_magic loaded" in cancel.shown
        assert reply["content"]["ename"] == "RunCancelled"
        assert "while starting Spark" in reply["content"]["evalue"]
        assert "this never runs" not in text_output(messages)
        assert kernel_children(kernel) == []  # no JVM, no Python worker, no rank
        reply, messages = kernel.execute(FIRST_CELL)  # the next cell starts Spark afresh
        assert reply["content"]["status"] == "ok", reply["content"]
        assert "says hello" in everything_shown(messages)
    finally:
        kernel.close()


# A session made in a module the notebook imports: no cell's text names the builder (#68).
HELPER = """\
from pyspark.sql import SparkSession

def get_spark():
    spark = SparkSession.builder.master("local[1]").config("spark.driver.memory", "600m") \\
        .getOrCreate()
    jvm = spark.sparkContext._jvm
    return spark.sparkContext.master, jvm.java.lang.Runtime.getRuntime().maxMemory() // 2**20
"""

FROM_A_THREAD = """\
import threading, spark_helper
made = []
thread = threading.Thread(target=lambda: made.append(spark_helper.get_spark()))
thread.start()
thread.join()
made[0]
"""


def own_session(kernel, cell):
    """The (master, JVM heap in MB) the cell's session got, and all the cell showed."""
    reply, messages = kernel.execute(cell)
    assert reply["content"]["status"] == "ok", reply["content"]
    [value] = [m["content"]["data"]["text/plain"] for m in messages
               if m["msg_type"] == "execute_result"]
    return eval(value), text_output(messages)


@pytest.mark.parametrize("when", ["while it starts", "once it is up"])
def test_a_session_a_module_builds_gets_what_it_asked_for_whenever_it_is_made(tmp_path, when):
    """Called from a thread while the start begun at load is under way (it must never meet the
    half-made context), or from a cell once that session is up (getOrCreate would hand it back):
    the builder's master and settings, the background session and its JVM stopped first."""
    (tmp_path / "spark_helper.py").write_text(HELPER)
    kernel = prestarted_kernel(tmp_path)
    try:
        if when == "once it is up":
            assert kernel.value("hvd_magic.launch.prestart.current().wait() is not None")
        (master, heap_mb), shown = own_session(
            kernel, FROM_A_THREAD if when == "while it starts" else
            "import spark_helper\nspark_helper.get_spark()")
        assert master == "local[1]"  # not the local[4] begun at load
        assert heap_mb < 1024  # a JVM launched with its memory setting (Java's default: 1 GB)
        assert "stopped the Spark session it started in the background, for a Spark session " \
               "of your own" in shown
        assert len(java_pids(kernel)) == 1
        assert kernel.value("hvd_magic.launch.prestart.current() is None")
    finally:
        kernel.close()


def test_no_session_is_begun_where_the_user_chooses_or_cannot_have_one():
    from hvd_magic.launch.prestart import why_not
    java = {"PATH": os.environ["PATH"]}
    assert why_not({}, dict(java, HVD_MAGIC_PRESTART="0")) == "HVD_MAGIC_PRESTART=0"
    assert why_not({}, dict(java, SPARK_REMOTE="sc://host")) == "the platform's own session"
    assert why_not({}, dict(java, DATABRICKS_RUNTIME_VERSION="15.4")) is not None
    assert why_not({}, {"PATH": "/nowhere"}) == "no Java"


def test_make_demo_prints_the_notebook_and_no_warnings(tmp_path):
    """What `make demo` runs, in a fresh folder: its whole output, stdout and stderr."""
    shutil.copy(os.path.join(ROOT, "notebooks", "quickstart.ipynb"), tmp_path)
    proc = subprocess.run([sys.executable, "-m", "hvd_magic.demo", "quickstart.ipynb"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert not [line for line in out.splitlines() if re.search(r"warn", line, re.I)], out
    for chatter in CHATTER:
        assert chatter not in out
    # (local[N] says why N: the room it has, more than --np 2 asked for)
    assert re.search(r"^\[hvd_magic\] starting Spark \(local\[(\d+)\]: room for \1 ranks\)… "
                     r"\d+\.\d s$", out, re.M), out
    assert out.index("starting Spark") < out.index("[rank 0]")
    assert "results: [3.0, 3.0]" in out
    assert not glob.glob(str(tmp_path / "*ipc*"))  # the kernel's IPC sockets were cleaned up


CXX_INFO = "2024-05-01 10:00:00.123456: I tensorflow/core/util/port.cc:113] oneDNN custom operations are on."
CXX_WARNING = "[2024-05-01 10:00:00.123456: W /horovod/common/operations.cc:12] a warning"


def test_cxx_info_lines_are_logged_but_not_shown(ip, capsys, tmp_path):
    cell = (f"import sys\nprint({CXX_WARNING!r}, file=sys.stderr)\n"
            f"print({CXX_INFO!r}, file=sys.stderr)\nprint('epoch 1')\n")
    ip.run_cell_magic("horovod", "--np -2", cell)
    out = capsys.readouterr()
    assert "a warning" in out.err and "oneDNN" not in out.out + out.err and "epoch 1" in out.out
    import hvd_magic
    assert CXX_INFO in open(hvd_magic.last_run().log_path(0)).read()
    ip.run_cell_magic("horovod", "--np -2 --verbose", cell)
    assert "oneDNN" in capsys.readouterr().err


ABSL_NOTE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"


def test_dashboard_rows_and_panels_skip_start_up_chatter():
    import html
    from hvd_magic.driver.ranks import RankState
    from hvd_magic.view.dashboard import Dashboard

    class Run:  # what a drawing reads of a run
        np, background, ranks = 1, False, [RankState(0)]

        def log_path(self, rank, readable=False):
            return f"run/rank-{rank}.{'txt' if readable else 'log'}"

    def shown(dashboard):  # what the rank's row's last line and its log panel show, when drawn
        row = dashboard._row_html(run.ranks[0])
        last = html.unescape(re.findall(r"<code[^>]*>([^<]*)</code>", row)[-1])
        body = dashboard._log_html(run, 0).rsplit("<pre", 1)[1]
        panel = [line for line in (ABSL_NOTE, CXX_INFO, "step 3", CXX_WARNING)
                 if html.escape(line, quote=True) in body]
        return last, panel

    for verbose in (False, True):
        dashboard, run = Dashboard(verbose=verbose), Run()
        dashboard.start(run)
        dashboard.event(run, 0, {"t": "lines", "stream": "stderr",
                                 "lines": ["step 3", ABSL_NOTE, CXX_INFO]})
        # (tails are kept raw: the chatter is left out when the row and the panel are drawn)
        assert shown(dashboard) == ((CXX_INFO, [ABSL_NOTE, CXX_INFO, "step 3"]) if verbose
                                    else ("step 3", ["step 3"]))
        dashboard.event(run, 0, {"t": "lines", "stream": "stderr", "lines": [CXX_WARNING]})
        assert shown(dashboard)[0] == CXX_WARNING and CXX_WARNING in shown(dashboard)[1]


@pytest.mark.parametrize("magic", ["horovod", "horovod_timeline", "horovod_env", "horovod_session",
                                   "horovod_tensorboard"])
def test_help_opens_with_a_sentence_and_an_example_that_runs(ip, magic, capsys):
    from hvd_magic.frontends.magics import HorovodMagics

    doc = getattr(HorovodMagics, magic).__doc__
    paragraphs = doc.split("\n\n")
    sentence = paragraphs[0]
    assert sentence.endswith(".") and ". " not in sentence and "\n" not in sentence
    example = 1 if paragraphs[1].startswith("    %") else 2  # at once, or after "Example:"
    assert example == 1 or paragraphs[1].endswith(":")
    assert paragraphs[example].startswith("    %")  # an example before all else
    assert "::" not in doc and "``" not in doc, doc  # %%horovod? shows it as it is: no reST
    text = "\n\n".join(paragraphs[example:]).split("\n\nUsage:")[0]
    # the example's cells, as a user pastes them: each starts at an unindented magic line
    cells = re.split(r"\n\n(?=    %)", text)
    assert any(f"%{magic}" in cell for cell in cells)
    for cell in cells:
        result = ip.run_cell(re.sub(r"^    ", "", cell, flags=re.M))
        assert result.success, (cell, result.error_before_exec or result.error_in_exec)


def test_the_first_environment_error_points_to_horovod_env(ip):
    """A package the executors lack: the rank's ImportError says where to compare them."""
    import hvd_magic

    with pytest.raises(hvd_magic.RankError) as error:
        ip.run_cell_magic("horovod", "--np 2", "import no_such_package_of_hvd_magic_tests\n")
    assert "%horovod_env" in "\n".join(error.value._render_traceback_())
    # a Spark task that fails before its rank starts (hvd_magic itself missing there) says so too
    from hvd_magic.launch.spark_errors import java_message
    text = ("org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            "ModuleNotFoundError: No module named 'hvd_magic'\n")
    assert "%horovod_env" in java_message(RuntimeError(text))


def _hold_slots(sc, seconds):
    """A job that keeps every task slot busy for `seconds` (another user's job, say)."""
    import time
    slots = sc.defaultParallelism
    sc.setJobGroup("slot-holder", "holds every slot")
    sc.parallelize(range(slots), slots).foreach(lambda _: time.sleep(seconds))


def _ranks_hello():
    import os
    print("hello from", os.environ["HOROVOD_RANK"])


def test_text_view_says_it_waits_for_spark_slots(ip):
    """While other work holds every slot, the barrier stage waits; the view says so."""
    import io
    import threading
    import time

    import hvd_magic
    from hvd_magic.launch.spark import SparkLauncher
    from hvd_magic.view import TextView

    sc = SparkLauncher().prepare(2).sparkContext  # the session the run will use
    holder = threading.Thread(target=_hold_slots, args=(sc, 8), daemon=True)
    holder.start()
    deadline = time.monotonic() + 60
    while not sc.statusTracker().getActiveStageIds() and time.monotonic() < deadline:
        time.sleep(0.1)
    shown = io.StringIO()
    run = hvd_magic.run(_ranks_hello, np=2, view=TextView(stdout=shown, stderr=shown))
    holder.join()
    text = shown.getvalue()
    assert run.state == "done"
    assert re.search(r"\[hvd_magic\] waiting for Spark \(local\[\d+\]\) to start 2 tasks at once… \d",
                     text)
    assert text.index("waiting for") < text.index("[rank 0] hello")



def test_a_jvm_that_cannot_start_says_why(tmp_path):
    """Its output is not shown as it happens, so the error brings what it said."""
    env = dict(os.environ, JAVA_HOME=str(tmp_path / "no-java"))
    code = ("import hvd_magic\ntry:\n    hvd_magic.run(abs, np=2, args=(1,))\n"
            "except hvd_magic.LaunchError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert "Spark's JVM did not start" in proc.stdout, proc.stdout + proc.stderr
    assert "no-java/bin/java" in proc.stdout  # what spark-class said
    assert "spark-" in proc.stdout and ".log" in proc.stdout  # and where it is kept
