"""The notebook's own modules reach executors that cannot see the notebook's folder.

The standalone cluster's workers run in a mount namespace where the notebook's folder is an empty
tmpfs: what they can import of `mylib` (a module), `mypkg` (a package it imports) and `shapes`
(whose class travels as an instance) is only what hvd_magic shipped with the job.
"""

import os
import sys
import textwrap

import pytest

import hvd_magic
from conftest import StandaloneCluster
from hvd_magic.capture.modules import local_sources, names_in_pickle

MYLIB = """\
from mypkg.helpers import twice

def scale(x):
    return twice(x) * 3
"""
SHAPES = """\
class Box:
    def __init__(self, side):
        self.side = side

    def area(self):
        return self.side ** 2
"""


@pytest.fixture
def notebook_folder(tmp_path, monkeypatch):
    folder = tmp_path / "notebook"
    (folder / "mypkg").mkdir(parents=True)
    (folder / "mylib.py").write_text(MYLIB)
    (folder / "shapes.py").write_text(SHAPES)
    (folder / "unused.py").write_text("raise RuntimeError('never shipped, never imported')\n")
    (folder / "mypkg" / "__init__.py").write_text("")
    (folder / "mypkg" / "helpers.py").write_text("def twice(x):\n    return 2 * x\n")
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    yield folder
    for name in ("mylib", "shapes", "mypkg", "mypkg.helpers"):
        sys.modules.pop(name, None)


@pytest.fixture
def hidden_cluster(tmp_path_factory, notebook_folder):
    hide = ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f'mount -t tmpfs none {notebook_folder} && exec "$@"', "hide"]
    cluster = StandaloneCluster(str(tmp_path_factory.mktemp("hidden")),
                                worker_prefixes={0: hide, 1: hide}).start()
    yield cluster
    cluster.stop()


def test_only_the_modules_a_job_imports_are_shipped(notebook_folder):
    import cloudpickle
    import mylib
    import shapes
    names = names_in_pickle(cloudpickle.dumps(mylib.scale)) | names_in_pickle(
        cloudpickle.dumps(shapes.Box(2)))
    shipped = local_sources(names)
    assert sorted(shipped) == ["mylib.py", os.path.join("mypkg", "__init__.py"),
                               os.path.join("mypkg", "helpers.py"), "shapes.py"]
    assert shipped["mylib.py"] == MYLIB
    assert local_sources({"numpy", "torch", "hvd_magic", "os"}) == {}  # installed: not ours
    # hvd_magic from a checkout beside the notebook is not the notebook's own: ranks run theirs.
    assert local_sources({"hvd_magic"}, folder=os.path.dirname(os.path.dirname(hvd_magic.__file__))) == {}


def test_a_cell_and_a_horovodrunner_function_import_local_modules_on_hidden_workers(
        ip, fresh_ns, hidden_cluster, notebook_folder):
    import mylib
    import shapes
    hidden_cluster.session()
    fresh_ns.update(mylib=mylib, box=shapes.Box(3))
    value = ip.run_cell_magic("horovod", "--np 2 --quiet", textwrap.dedent("""\
        import os
        assert not os.path.exists("mylib.py")  # this worker cannot see the notebook's folder
        mylib.scale(int(os.environ["HOROVOD_RANK"])) + box.area()
        """))
    assert value == 0 * 6 + 9
    assert hvd_magic.last_run().results == [9, 15]

    def train(x):
        import mylib
        return mylib.scale(x)

    assert hvd_magic.HorovodRunner(np=2, quiet=True).run(train, x=5) == 30

    # A training script in the same folder: its text and the module beside it travel too.
    (notebook_folder / "train.py").write_text(textwrap.dedent("""\
        import os, sys
        import mylib
        assert not os.path.exists(__file__)  # the worker sees neither the script nor its folder
        print("scaled", mylib.scale(int(sys.argv[1]) + int(os.environ["HOROVOD_RANK"])))
        """))
    run = hvd_magic.run_script("train.py", args=["1"], np=2, view=None)
    assert run.state == "done" and run.results == [None, None]
    assert [open(run.log_path(r)).read().strip() for r in (0, 1)] == ["scaled 6", "scaled 12"]


SCRIPT = """\
import sys
import hvd_magic

def double(x):
    import os
    return 2 * x + int(os.environ["HOROVOD_RANK"])

print("results", hvd_magic.run(double, np=-2, args=(21,)).results)
"""


@pytest.mark.parametrize("how", ["stdin", "-c"])
def test_a_script_read_from_stdin_or_given_with_c_runs(tmp_path, how):
    """`python - <<EOF` and `python -c`: __main__'s pseudo-file ('<stdin>') is no module to ship,
    and the script's own functions travel by value."""
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    argv = [sys.executable, "-"] if how == "stdin" else [sys.executable, "-c", SCRIPT]
    done = subprocess.run(argv, input=SCRIPT if how == "stdin" else None, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "results [42, 43]" in done.stdout
