"""A Horovod built against another torch says so in plain words, on a rank and in %horovod_env.

The stale build is a real one in miniature: a `horovod` package whose `horovod.torch` extension
is a real shared library needing a symbol the installed torch does not have, so importing it
fails the way a stale Horovod does (`ImportError: ...so: undefined symbol: ...`), and whose
`_hvd_magic_build.py` says what it was built against, as our recipe
(hvd_magic/horovod_build/build.sh) writes it.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import hvd_magic
from hvd_magic.rank import buildcheck


@pytest.fixture
def stale_horovod(tmp_path):
    """A folder to put first on PYTHONPATH: a horovod built for torch 2.1.0 and TensorFlow 2.15.0."""
    root = tmp_path / "stale"
    (root / "horovod" / "torch").mkdir(parents=True)
    (root / "horovod" / "__init__.py").write_text("__version__ = '0.28.1'\n")
    (root / "horovod" / "_hvd_magic_build.py").write_text(
        '# Written by hvd_magic/horovod_build/build.sh: the versions this build fits.\n'
        'BUILT_WITH = {"torch": "2.1.0", "tensorflow": "2.15.0", "flavour": "patched"}\n')
    (root / "horovod" / "torch" / "__init__.py").write_text(
        "from horovod.torch import mpi_lib_v2  # noqa: F401\n")
    source = tmp_path / "mpi_lib_v2.c"
    source.write_text("void _ZN3c104impl15torch_gone_2_1Ev(void);\n"
                      "void PyInit_mpi_lib_v2(void) { _ZN3c104impl15torch_gone_2_1Ev(); }\n")
    suffix = subprocess.run([sys.executable, "-c", "import sysconfig;"
                             "print(sysconfig.get_config_var('EXT_SUFFIX'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["cc", "-shared", "-fPIC", "-o",
                    str(root / "horovod" / "torch" / f"mpi_lib_v2{suffix}"), str(source)],
                   check=True)
    return root


def test_a_rank_with_a_stale_horovod_says_which_versions_and_how_to_rebuild(ip, stale_horovod):
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", f"--np -1 --quiet --env PYTHONPATH={stale_horovod}",
                          "import horovod.torch as hvd\nhvd.init()")
    text = str(info.value)
    headline = text.splitlines()[0]
    assert "HorovodBuildMismatch" in headline
    import torch
    assert f"built against torch 2.1.0, but this rank has torch {torch.__version__}" in headline
    assert "tensorflow 2.15.0" in headline  # both frameworks differ, both are named
    assert "python -m hvd_magic.build_horovod" in headline  # what a pip user can run
    assert "undefined symbol" in text  # the original error is still below, for the curious


def test_an_undefined_symbol_without_a_record_still_says_rebuild(stale_horovod):
    (stale_horovod / "horovod" / "_hvd_magic_build.py").unlink()
    code = textwrap.dedent("""
        from hvd_magic.rank import buildcheck
        try:
            import horovod.torch
        except ImportError as exc:
            print(buildcheck.explain(exc))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(stale_horovod))).stdout
    assert "does not fit the frameworks on this rank (torch " in out
    assert "python -m hvd_magic.build_horovod" in out


def test_other_errors_are_left_alone():
    assert buildcheck.explain(ValueError("undefined symbol")) is None
    assert buildcheck.explain(ImportError("No module named 'horovod'")) is None


def test_horovod_env_shows_what_horovod_was_built_with(stale_horovod):
    # This interpreter's Horovod, built by our recipe, records its frameworks.
    import torch
    built = buildcheck.built_with()
    assert built["torch"] == torch.__version__ and built["tensorflow"] == buildcheck.installed(
        "tensorflow")
    # An interpreter with the stale one: the probe's row names it, and the note says what to do.
    row = json.loads(subprocess.run(
        [sys.executable, "-m", "hvd_magic.launch.envcheck"], capture_output=True, text=True,
        check=True, env=dict(os.environ, PYTHONPATH=str(stale_horovod))).stdout)["values"]
    assert row["horovod_built"] == "torch 2.1.0, tensorflow 2.15.0, flavour patched"
    assert row["horovod_gloo"].startswith("horovod.torch fails (ImportError")
    notes = buildcheck.stale_build(row)
    assert len(notes) == 2 and "built against torch 2.1.0 but torch" in notes[0]
    assert "python -m hvd_magic.build_horovod" in notes[0]
