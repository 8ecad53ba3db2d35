"""What a SIGKILLed notebook or Spark task leaves behind: nothing (hvd_magic/cleanup.py).

Each test really kills the process that made the files (a notebook in a process of its own, a
Spark task's Python worker) and looks for exactly the paths that run made, never by name."""

import os
import pickle
import subprocess
import sys
import time

import pytest

import hvd_magic
from hvd_magic.payload import FILE_KEY
from tests.conftest import spark_session

GONE_WITHIN = 10.0  # seconds after the kill (the soak looks 10-30 s after it)


def _gone(paths, within=GONE_WITHIN):
    """The paths of `paths` still there after `within` seconds."""
    gone_by = time.monotonic() + within
    while any(os.path.exists(p) for p in paths) and time.monotonic() < gone_by:
        time.sleep(0.1)
    return [p for p in paths if os.path.exists(p)]


def test_a_killed_notebook_leaves_no_rank_folder_or_value_file():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    notebook = subprocess.Popen(
        [sys.executable, os.path.join(here, "tests", "killed_notebook.py")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=here,
        env=dict(os.environ, PYTHONPATH=here))
    try:
        for line in notebook.stdout:
            if "FOLDER " in line:
                folder = line.split("FOLDER ", 1)[1].split()[0]
                break
        else:
            pytest.fail("the notebook's rank never said its folder")
        with open(os.path.join(folder, "job.pkl"), "rb") as f:
            value_file = pickle.load(f)["kwargs"]["ballast"][FILE_KEY]
        assert os.path.isdir(folder) and os.path.isfile(value_file)
        notebook.kill()
    finally:
        notebook.kill()
        notebook.wait()
    assert _gone([folder, value_file]) == []


def test_a_killed_spark_task_leaves_no_rank_folder(ip, tmp_path):
    spark_session(1)
    said = tmp_path / "folder"
    cell = ("import os\n"
            f"open({str(said)!r}, 'w').write(os.path.dirname(os.environ['HVD_MAGIC_STACKS_FILE']))\n"
            "# its task (a Spark Python worker): a forked rank's parent is the template\n"
            "os.kill(int(os.environ.get('HVD_MAGIC_TASK_PID') or os.getppid()), 9)\n"
            "import time; time.sleep(60)\n")
    with pytest.raises(hvd_magic.LaunchError):
        ip.run_cell_magic("horovod", "--np 1 --quiet", cell)
    folder = said.read_text()
    assert folder.startswith(os.path.join(os.path.dirname(folder), "hvd_magic-"))
    assert _gone([folder]) == []


def test_the_cleanup_process_removes_only_what_is_still_registered_once_users_are_gone(tmp_path):
    from hvd_magic.cleanup import Cleanup

    kept, forgotten, used, never = (tmp_path / n for n in ("kept", "forgotten", "used", "never"))
    for folder in (kept, forgotten, used, never):
        folder.mkdir()
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cleanup = Cleanup()
        cleanup.keep(str(kept))
        cleanup.keep(str(forgotten))
        cleanup.keep(str(used))
        cleanup.keep(str(used), rank.pid)
        cleanup.forget(str(forgotten))
        cleanup.proc.stdin.close()  # what the owner's death does to the pipe
        assert _gone([str(kept)]) == []
        assert used.exists()  # its rank still runs
        rank.kill()
        rank.wait()
        assert _gone([str(used)]) == []
        assert cleanup.proc.wait(timeout=10) == 0
        assert forgotten.exists() and never.exists()
    finally:
        rank.kill()
        rank.wait()


def test_a_process_that_imported_hvd_magic_from_a_zip_still_cleans_up_when_killed(tmp_path):
    """A cluster's executors import the hvd_magic that Spark shipped them, a zip (`sc.addPyFile`):
    its cleanup process runs from the module's source there, and still removes a killed task's
    folder."""
    import zipfile
    package = os.path.dirname(hvd_magic.__file__)
    shipped = tmp_path / "hvd_magic.zip"
    with zipfile.ZipFile(shipped, "w") as z:
        for folder, _, names in os.walk(package):
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    z.write(path, os.path.relpath(path, os.path.dirname(package)))
    kept = tmp_path / "rank-folder"
    kept.mkdir()
    task = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nimport hvd_magic.cleanup as c\n"
         "assert c.__file__.startswith(sys.argv[1]), c.__file__\n"
         "c.Cleanup.here().keep(sys.argv[2])\nprint('kept', flush=True)\ntime.sleep(60)\n",
         str(shipped), str(kept)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
        env=dict(os.environ, PYTHONPATH=str(shipped)))
    try:
        assert task.stdout.readline().strip() == "kept", task.stderr.read()
        task.kill()
        task.wait()
        assert _gone([str(kept)]) == []
        assert "no cleanup process" not in task.stderr.read()
    finally:
        task.kill()
        task.wait()
