"""The text view, in a real IPython InteractiveShell: ``[rank k]`` lines as they arrive (stdout and
stderr kept apart), then one summary line per rank."""

import re

import pytest

import hvd_magic
from hvd_magic.lines import is_chatter, last_said, screen
from hvd_magic.view import TextView, make_view, visible_text, widgets_available

PRINTING_CELL = r"""
import os, sys
rank = os.environ["HOROVOD_RANK"]
print(f"out {rank}")
print(f"err {rank}", file=sys.stderr)
sys.stdout.write(f"50%\r100% of {rank}\n")
sys.stdout.write(f"windows line {rank}\r\n")
sys.stdout.flush()
os.write(1, b"bad \xff\xfe bytes\n")
int(rank) * 10
"""


# What a rank writes for a terminal (Lightning's and rich's ways, all on stderr as Lightning
# writes), after values it reported and then a step without them (as a Lightning fit reports:
# the values reach the driver only in the points of events that carry no metrics): colours, a
# line redrawn with \r and erased, a nested bar written over with the cursor moved up, a warning
# and a library's advert after the rank's last word, the cursor shown again at the very end.
TERMINAL_CELL = r"""
import os, sys, time, warnings
import hvd_magic
rank = os.environ["HOROVOD_RANK"]
for i in range(20):
    time.sleep(0.15)                                        # (the throttle's interval is over)
    hvd_magic.report(step=i, total=20)                      # a bar's step: sent at once
    hvd_magic.report(step=i, total=20, loss=1.0 / (i + 1))  # values logged just after it, and
    hvd_magic.report(step=i + 1, total=20)                  # the next step, sent in their place
print("\x1b[1mTotal FLOPs\x1b[0m: 0", file=sys.stderr)
sys.stderr.write("".join(f"\r\x1b[2Kbar {p}%" for p in (10, 50, 100)) + "\n")
sys.stderr.write("\rEpoch 0 50%")
sys.stderr.write("\n\rcheck 1/2\x1b[A")
sys.stderr.write("\n\rcheck 2/2\x1b[A")
sys.stderr.write("\n\r         \x1b[A\rEpoch 0 100%\n")
print(f"rank {rank}: done", file=sys.stderr)
warnings.warn("this API is old", UserWarning)
print("\U0001f4a1 Tip: try our cloud", file=sys.stderr)
print("\x1b[?25h", file=sys.stderr)
"""


def summary_line(out, rank):
    match = re.search(rf"^  rank {rank}( on \S+)?: (.*)$", out, re.M)
    assert match, out
    return match.group(2)


def test_lines_are_labelled_by_rank_and_summarised(ip, capsys):
    value = ip.run_cell_magic("horovod", "--np -2", PRINTING_CELL)
    assert value == 0
    captured = capsys.readouterr()
    for rank in range(2):
        assert f"[rank {rank}] out {rank}\n" in captured.out
        assert f"[rank {rank}] err {rank}\n" in captured.err
        assert f"err {rank}" not in captured.out
        assert f"[rank {rank}] 100% of {rank}\n" in captured.out   # the redraw, not the 50%
        assert f"[rank {rank}] windows line {rank}\n" in captured.out
        assert f"[rank {rank}] bad \ufffd\ufffd bytes\n" in captured.out
        assert summary_line(captured.out, rank) == "done, 5 lines"
    assert "50%" not in captured.out
    run = hvd_magic.last_run()
    assert f"hvd_magic run {run.id}: done in" in captured.out
    assert "on driver only" in captured.out


def test_terminal_output_is_printed_as_a_terminal_shows_it(ip, capsys):
    """No escape code printed, a redrawn line as its last state, a nested bar's lines written
    over not printed; the metrics' last values are the ones reported last."""
    ip.run_cell_magic("horovod", "--np -2", TERMINAL_CELL)
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out + captured.err
    for rank in range(2):
        for line in ("Total FLOPs: 0", "bar 100%", "Epoch 0 100%", f"rank {rank}: done"):
            assert f"[rank {rank}] {line}\n" in captured.err
    for line in ("bar 50%", "check 1/2", "check 2/2", "[?25h"):
        assert line not in captured.err
    assert "  loss: last (min..max): rank 0 0.05 (0.05..1); rank 1 0.05" in captured.out
    for rank in range(2):
        assert hvd_magic.last_run().ranks[rank].metrics == {"loss": 0.05}
        assert hvd_magic.last_run().ranks[rank].last_line == f"rank {rank}: done"
    # The readable log (what the views' links open) reads as the text view printed; the raw
    # log beside it keeps every byte.
    run = hvd_magic.last_run()
    for rank in range(2):
        with open(run.log_path(rank, readable=True)) as f:
            readable = f.read()
        with open(run.log_path(rank)) as f:
            raw = f.read()
        printed = re.findall(rf"^\[rank {rank}\] (.*)$", captured.err, re.M)
        assert readable.splitlines() == printed, readable
        assert "\x1b" not in readable and "\r" not in readable
        assert "\x1b[1mTotal FLOPs\x1b[0m: 0" in raw and "check 1/2" in raw


def test_summary_shows_progress_from_tqdm(ip, capsys):
    cell = "from tqdm import tqdm\nimport time\nfor _ in tqdm(range(50)):\n    time.sleep(0.01)\n"
    ip.run_cell_magic("horovod", "--np -2", cell)
    out = capsys.readouterr().out
    for rank in range(2):
        assert summary_line(out, rank).startswith("done, step 50/50")


def test_failed_rank_is_summarised_as_failed(ip, capsys):
    cell = "import os\nif os.environ['HOROVOD_RANK'] == '1':\n    raise ValueError('no')\n"
    with pytest.raises(hvd_magic.RankError):
        ip.run_cell_magic("horovod", "--np -2", cell)
    out = capsys.readouterr().out
    assert summary_line(out, 1).startswith("failed")
    assert hvd_magic.last_run().state == "failed"


def test_quiet_prints_nothing_but_returns_the_value(ip, capsys):
    value = ip.run_cell_magic("horovod", "--np -2 --quiet", "print('noise')\n'value'")
    assert value == "value"
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_a_shell_without_a_kernel_gets_the_text_view(ip, monkeypatch):
    monkeypatch.delenv("HVD_MAGIC_NO_WIDGETS", raising=False)
    assert not widgets_available()          # InteractiveShell: no kernel, so no front end
    assert type(make_view()) is TextView
    assert make_view(quiet=True).quiet
    assert type(make_view(widgets=False)) is TextView


def test_a_stall_warning_goes_to_stderr_and_our_news_to_stdout(ip, capsys):
    """A message about the whole run (rank None) is not a rank's line; only the stall watchdog's
    warning is stderr (a notebook shows stderr in red): --data's shards, a ring that re-formed,
    a note before Spark starts are news."""
    view = TextView()
    view.event(None, None, {"t": "stall", "message": "stall: rank 1 waits"})
    captured = capsys.readouterr()
    assert captured.err == "[hvd_magic] stall: rank 1 waits\n" and captured.out == ""
    for kind in ("shards", "ring", "lost", "note"):
        view.event(None, None, {"t": kind, "message": f"about {kind}"})
        captured = capsys.readouterr()
        assert captured.out == f"[hvd_magic] about {kind}\n" and captured.err == ""


def test_one_line_is_a_line(ip, capsys):
    ip.run_cell_magic("horovod", "--np -2", "print('one')")
    out = capsys.readouterr().out
    assert summary_line(out, 0) == "done, 1 line" and summary_line(out, 1) == "done, 1 line"


@pytest.mark.parametrize("line, shown", [
    ("plain", "plain"),
    ("10%\r50%\r100%", "100%"),
    ("windows\r", "windows"),
    ("", ""),
    ("\r", ""),
])
def test_visible_text_is_what_a_terminal_shows(line, shown):
    assert visible_text(line) == shown


def test_a_log_is_shown_as_the_rows_a_terminal_shows():
    # tqdm's nested bar (down a line, redrawn, back up), cleared, then the main bar redrawn
    lines = ["\rEpoch 0 50%", "\rcheck 1/2\x1b[A", "\rcheck 2/2\x1b[A",
             "\r         \x1b[A\rEpoch 0 100%", "done"]
    assert screen(lines) == ["Epoch 0 100%", "done"]
    # rich's live display: erased and redrawn, colours, the cursor hidden and shown
    rich = ["\x1b[?25l", "\r\x1b[2K\x1b[35mEpoch 0\x1b[0m 1/2\r\x1b[2K\x1b[35mEpoch 0\x1b[0m 2/2",
            "\x1b[?25h"]
    assert screen(rich) == ["", "Epoch 0 2/2", ""]


WARNING = ["/site-packages/lightning/pytorch/utilities/_pytree.py:21: `isinstance(treespec, "
           "LeafSpec)` is deprecated", "Cell In[3], line 4: UserWarning: this API is old",
           '  warnings.warn("this API is old", UserWarning)']


@pytest.mark.parametrize("lines, shown", [
    (["epoch 3: loss 0.25", *WARNING], ("epoch 3: loss 0.25", False)),
    (["epoch 3: loss 0.25", "\U0001f4a1 Tip: try our cloud", "\x1b[?25h"],
     ("epoch 3: loss 0.25", False)),
    (["  indented, the rank's own"], ("  indented, the rank's own", False)),
    (WARNING, ("Cell In[3], line 4: UserWarning: this API is old", True)),  # nothing else
    (["\x1b[?25l", "\r\x1b[2KEpoch 0 1/2\r\x1b[2KEpoch 0 2/2", "\x1b[?25h"],
     ("Epoch 0 2/2", False)),
    # a rule (Lightning's banner), a drawn table's border: the words above them
    (["All distributed processes registered. Starting with 2 processes", "-" * 100],
     ("All distributed processes registered. Starting with 2 processes", False)),
    (["│ 0 │ layer │ Linear │      5 │", "└───┴───────┴────────┴────────┘"],
     ("│ 0 │ layer │ Linear │      5 │", False)),
])
def test_a_warning_an_advert_or_a_rule_is_a_last_line_only_when_nothing_else_is(lines, shown):
    assert last_said(reversed(lines)) == shown


def test_a_cells_warning_names_the_cell_as_its_traceback_does(ip, capsys):
    ip.run_cell_magic("horovod", "--np -1", "import warnings\nwarnings.warn('this API is old')\n")
    err = capsys.readouterr().err
    # (line 3 of the cell as the notebook shows it, under its %%horovod line)
    assert re.search(r"Cell In\[\d+\], line 3: UserWarning: this API is old", err), err
    assert "hvd_magic cell" not in err


def test_the_drivers_last_line_is_not_taken_by_a_later_warning():
    import types
    from hvd_magic.driver.apply import apply_event
    from hvd_magic.driver.ranks import RankState

    folder = types.SimpleNamespace(write_lines=lambda rank, lines: None, record=lambda e: None)
    run = types.SimpleNamespace(np=1, ranks=[RankState(0)], folder=folder, view=None,
                                elastic=None)
    for lines in ([WARNING[0]], ["\x1b[1mepoch 3\x1b[0m: loss 0.25"], WARNING[1:], ["\x1b[?25h"]):
        apply_event(run, {"t": "lines", "rank": 0, "lines": lines}, None)
        assert run.ranks[0].last_line == (WARNING[0] if lines == [WARNING[0]]
                                          else "epoch 3: loss 0.25")


def test_a_wait_is_said_once_even_if_the_run_still_waits_after_an_event(capsys):
    """Task 0's rendezvous event ends the wait's line before any rank has a state; the run says
    it waits a moment longer: the same wait is not printed again (seen as two lines when
    hvd-run was piped)."""
    import types
    view = TextView()
    run = types.SimpleNamespace(np=2, state="running", waiting=("waiting for Spark", 2.0))
    view.tick(run)
    view.event(run, 0, {"t": "rendezvous", "port": 1234})
    view.tick(run)
    run.waiting = ("waiting for something else", 1.5)
    view.tick(run)
    view.finish(types.SimpleNamespace(np=2, started=None))
    out = capsys.readouterr().out
    assert out.count("waiting for Spark") == 1, out
    assert out.count("waiting for something else") == 1, out


def test_more_ranks_than_cores_on_local_spark_says_they_share_the_cores(ip, capsys):
    """Before it runs more ranks than the machine has cores, a local session says so, as a line of
    its own (stdout: news, not an error); a run that fits says nothing of the kind."""
    import os
    from conftest import spark_session

    cores = os.cpu_count() or 1
    if cores > 3:
        pytest.skip("a machine with more than 3 cores would need a large local session here")
    spark_session(4)  # the shared embedded session: local[4]
    ip.run_cell_magic("horovod", f"--np {cores + 1} --text", "1")
    captured = capsys.readouterr()
    assert (f"[hvd_magic] {cores + 1} ranks on local[4] share this machine's {cores} CPU core"
            in captured.out), captured.out
    assert "share this machine" not in captured.err
    ip.run_cell_magic("horovod", f"--np {cores} --text", "1")
    assert "share this machine" not in capsys.readouterr().out
    ip.run_cell_magic("distributed", f"--np -{cores + 1} --text", "1")  # the driver's ranks too
    assert (f"[hvd_magic] {cores + 1} ranks on the driver share this machine's {cores} CPU core"
            in capsys.readouterr().out)


def test_one_of_a_thing_is_singular():
    from hvd_magic.words import plural
    from hvd_magic.data.plan import describe

    assert plural(1, "line") == "1 line" and plural(2, "line") == "2 lines"
    assert plural(1024, "rank") == "1,024 ranks"
    assert describe({"counts": [1], "source": "read directly"}) == \
        "--data: 1 row in 1 shard of 1 row each, read directly"


@pytest.mark.parametrize("line, chatter", [
    ("USDT:2026-11-29 22:56:12 23122:23122 SyncActivityProfilerHandler.cpp:59] profiler_stop",
     True),
    ("STAGE:2026-11-29 22:59:54 31777:31777 SyncActivityProfilerHandler.cpp:51] Completed "
     "Stage: Warm Up", True),
    ("I0501 10:00:00.123456 123 cuda_dnn.cc:12] TensorFlow's note", True),
    # (torch's CUDA build on a CPU machine, as the profiler starts: torch 2.14.1 from PyPI)
    ("ERROR:2026-12-07 14:39:01 12391:12391 DeviceProperties.cpp:56] gpuGetDeviceCount failed "
     "with code 35", True),
    ("ERROR:2026-12-07 14:39:01 12391:12391 train.cpp:56] a rank's own error", False),
    ("USDT: a user's own line about USDT", False),
    # Gloo's own note as its mesh connects (JAX's CPU collectives print it after the cell's lines)
    ("[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1",
     True),
    ("[Gloo] my own line", False),
    ("step 3: loss 0.25", False),
])
def test_the_profilers_and_libraries_chatter_is_not_a_ranks_last_line(line, chatter):
    """(--timeline's ranks each ended with torch's profiler_stop as their last line.)"""
    assert is_chatter(line) is chatter
