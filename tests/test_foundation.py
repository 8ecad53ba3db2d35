"""The spine: %%horovod runs a cell on N real Horovod ranks through a Spark barrier stage."""

import os
import re

import pytest
from IPython.core.error import UsageError

import hvd_magic
from conftest import ALLREDUCE_CELL


@pytest.mark.parametrize("np, expected", [(2, 3.0), (4, 10.0)])
def test_allreduce_cell_on_embedded_spark(ip, capsys, np, expected):
    value = ip.run_cell_magic("horovod", f"--np {np}", ALLREDUCE_CELL)
    assert value == expected
    run = hvd_magic.last_run()
    assert run.results == [expected] * np
    assert run.state == "done"
    assert run.where.startswith("local[")
    out = capsys.readouterr().out
    for rank in range(np):
        assert f"[rank {rank}] rank {rank} of {np}: {expected}" in out


def test_rank_logs_hold_every_line(ip):
    cell = "import os\nfor i in range(500):\n    print(f'line {i} of rank {os.environ[\"HOROVOD_RANK\"]}')\n"
    ip.run_cell_magic("horovod", "--np 2 --quiet", cell)
    run = hvd_magic.last_run()
    for rank in range(2):
        with open(os.path.join(run.run_dir, f"rank-{rank}.log")) as f:
            lines = f.read().splitlines()
        assert lines == [f"line {i} of rank {rank}" for i in range(500)]


def test_error_on_one_rank_shows_that_ranks_traceback(ip):
    cell = ("import horovod.torch as hvd\n"
            "hvd.init()\n"
            "if hvd.rank() == 1:\n"
            "    1 / 0\n"
            "hvd.rank()\n")
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np 2", cell)
    err = info.value
    assert err.rank == 1
    rendered = "\n".join(err._render_traceback_())
    assert "rank 1" in rendered
    assert "ZeroDivisionError" in rendered
    assert "1 / 0" in rendered          # the user's own line, from the cell's text
    assert re.search(r"Cell In\[\d+\], line 5", rendered), rendered  # as IPython numbers the
    # editor's lines (the %%horovod line is line 1)
    assert "py4j" not in rendered.lower() and "java" not in rendered.lower()
    assert hvd_magic.last_run().state == "failed"


@pytest.mark.parametrize("line, words", [
    ("--np 0", "non-zero"),
    ("--np x", "invalid int"),
    ("--np 2 --timeout -1", "positive"),
    ("--np 2 --export 'a b'", "not a name"),
    ("--bogus", "unrecognized"),
])
def test_bad_options_are_usage_errors(ip, line, words):
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("horovod", line, "1")
    assert type(info.value) is UsageError
    assert words in str(info.value)


def test_api_without_ipython_returns_run_in_rank_order(tmp_path):
    def rank_and_size(offset):
        import horovod.torch as hvd
        hvd.init()
        return hvd.rank() * 10 + offset

    run = hvd_magic.run(rank_and_size, np=2, args=(7,), run_dir=str(tmp_path / "r"))
    assert run.results == [7, 17]
    assert run.value == 7
    assert run.state == "done"
    assert hvd_magic.last_run() is run
    assert {"rank-0.log", "rank-1.log", "run.json"} <= set(os.listdir(run.run_dir))


def test_help_is_generated_from_the_docstring(ip):
    from hvd_magic.frontends.magics import HorovodMagics
    doc = HorovodMagics.horovod.__doc__
    assert "--np" in doc and "Examples" in doc and "--timeout" in doc
