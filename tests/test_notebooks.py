"""The notebooks in notebooks/, executed by nbclient in a real kernel (the venv's `python3`), with
assertions on what a person would see under each cell; and a check that git holds them without
outputs.

A cell's "view" is everything shown under it: printed text, values, errors, and the text of the
dashboard's widgets (the HTML widgets under the displayed box, as nbclient recorded their state
from the kernel's comm messages). Whether a run lasted long enough to get a dashboard or printed
plain text does not change what the assertions look for.
"""

import json
import os
import re
import shutil
import subprocess

import nbformat

from conftest import ROOT, ipc_config, pictures_in

NOTEBOOKS = os.path.join(ROOT, "notebooks")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
ARTIFACTS = os.path.join(ROOT, "test-artifacts", "notebooks")
DONE_ROW = re.compile(r"<tr data-rank='(\d+)' data-state='done'")
KNOB = "import hvd_magic.view.dashboard\nhvd_magic.view.dashboard.SHOW_AFTER = 0"


def execute(name, cwd, dashboard_at_once=False):
    """Run notebooks/<name> in a fresh kernel whose folder is `cwd`; return the executed notebook.
    `dashboard_at_once`: a cell after the one that loads the extension makes every run show its
    dashboard from its start (`SHOW_AFTER` 0), however long it lasts; it is no code cell of
    the notebook's (`code_cells` leaves it out)."""
    from nbclient import NotebookClient

    path = os.path.join(cwd, name)
    shutil.copy(os.path.join(NOTEBOOKS, name), path)
    nb = nbformat.read(path, as_version=4)
    if dashboard_at_once:
        load = next(i for i, c in enumerate(nb.cells) if "%load_ext hvd_magic" in c.source)
        knob = nbformat.v4.new_code_cell(KNOB)
        knob.id = "test-knob"
        nb.cells.insert(load + 1, knob)
    # As a user's kernel: widgets on (another test in this session may have switched them off).
    env = {k: v for k, v in os.environ.items() if k != "HVD_MAGIC_NO_WIDGETS"}
    try:
        NotebookClient(nb, timeout=600, kernel_name="python3", config=ipc_config(),
                       resources={"metadata": {"path": str(cwd)}}).execute(env=env)
    finally:  # the executed notebook, to look at when an assertion fails
        os.makedirs(ARTIFACTS, exist_ok=True)
        nbformat.write(nb, os.path.join(ARTIFACTS, name))
    return nb


def widget_text(nb, model_id):
    """The values of the HTML widgets under a displayed widget, depth first."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    model = state.get(model_id, {}).get("state", {})
    parts = [model["value"]] if isinstance(model.get("value"), str) else []
    for child in model.get("children", []):
        parts.append(widget_text(nb, child.replace("IPY_MODEL_", "")))
    return "\n".join(parts)


def view(nb, cell):
    """Everything shown under one code cell, as text."""
    parts = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}\n" + "\n".join(out.traceback))
        else:
            data = out.get("data", {})
            if WIDGET_VIEW in data:
                parts.append(widget_text(nb, data[WIDGET_VIEW]["model_id"]))
            else:
                parts.extend(data.get(kind, "") for kind in ("text/plain", "text/html"))
    return "\n".join(parts)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code" and c.source != KNOB]


def results(cell):
    return [o.data["text/plain"] for o in cell.outputs if o.output_type == "execute_result"]


def errors(cell):
    return [o for o in cell.outputs if o.output_type == "error"]


def test_quickstart(tmp_path):
    nb = execute("quickstart.ipynb", tmp_path)
    _, horovod, after = code_cells(nb)
    shown = view(nb, horovod)
    for rank in range(2):
        assert f"rank {rank} of 2" in shown
        assert f"rank {rank}: allreduce sum = 3.0" in shown
    assert results(horovod) == ["3.0"]
    if "hvd-magic-run" in shown:  # the dashboard was shown: its HTML stays, not a widget
        assert sorted(DONE_ROW.findall(shown)) == ["0", "1"]  # a dashboard row per rank, done
        assert not any(WIDGET_VIEW in o.get("data", {}) for o in horovod.outputs)
    assert "results: [3.0, 3.0]" in view(nb, after)
    assert "state: done" in view(nb, after)
    run_dir = next(p for p in (tmp_path / "hvd_runs").iterdir() if p.is_dir())  # (beside spark-*.log)
    assert {"rank-0.log", "rank-1.log"} <= set(os.listdir(run_dir))


def test_pytorch_training(tmp_path):
    nb = execute("pytorch_training.ipynb", tmp_path)
    _, train, plot = code_cells(nb)
    shown = view(nb, train)
    assert results(train) == []  # the cell ends with `;`
    assert "saved " in shown and (tmp_path / "digits.pt").exists()
    # (a dashboard shows a line twice: in its table and in the rank's log)
    accuracies = dict(re.findall(r"rank (\d): test accuracy (0\.\d+)", shown))
    assert sorted(accuracies) == ["0", "1"]
    assert accuracies["0"] == accuracies["1"]  # averaged over the ranks: the same

    plotted = view(nb, plot)
    accuracy = float(re.search(r"test accuracy: (0\.\d+)", plotted).group(1))
    assert accuracy > 0.9  # a trained model, not chance (0.1)
    assert f"{accuracy:.3f}" == accuracies["0"]  # --export brought rank 0's value back
    assert "'0.weight'" in plotted  # the checkpoint holds the model's tensors
    assert any("image/png" in o.get("data", {}) for o in plot.outputs)  # the loss curves


def test_timeline(tmp_path):
    nb = execute("timeline.ipynb", tmp_path)
    _, run, picture, summary, ddp, ranks_picture = code_cells(nb)
    shown = view(nb, run)
    assert "rank 0: 20 steps done" in shown and "rank 1: 20 steps done" in shown
    assert not errors(picture) and not errors(summary)
    drawn = view(nb, picture)
    assert "Horovod timeline" in drawn and pictures_in(drawn) and "timeline.json" in drawn
    tables = view(nb, summary)
    assert "Top tensors" in tables and "Top operations" in tables
    assert "ALLREDUCE" in tables
    assert "0.weight" in tables  # a gradient tensor named after the model's parameter

    # torch without Horovod: every rank's profile; rank 1 (30 ms asleep a step) held the others
    assert "rank 0: 12 steps done" in view(nb, ddp) and not errors(ranks_picture)
    drawn = view(nb, ranks_picture)
    verdict = re.search(r"rank (\d) arrived last at (\d+) of (\d+) collectives \(all_reduce\); "
                        r"the others waited ([\d.]+) ms a step on it", drawn)
    assert verdict and verdict.group(1) == "1", drawn[:2000]
    assert 7.5 <= float(verdict.group(4)) <= 60, verdict.group(0)  # of the order of 30 ms
    assert pictures_in(drawn) and "timeline-ranks.json.gz" in drawn


def test_failures(tmp_path):
    nb = execute("failures.ipynb", tmp_path)
    _, rank_error, after_error, timeout, after_timeout, bad_option = code_cells(nb)

    shown = view(nb, rank_error)
    assert [e.ename for e in errors(rank_error)] == ["RankError"]
    assert "rank 1" in shown and "ZeroDivisionError" in shown and "1 / 0" in shown
    assert "py4j" not in shown.lower()
    assert view(nb, after_error).startswith("failed")

    assert [e.ename for e in errors(timeout)] == ["RunTimeout"]
    assert "10" in view(nb, timeout)
    assert view(nb, after_timeout).strip() == "timeout"

    # IPython prints a UsageError (no traceback: the user's mistake, not a crash)
    assert "UsageError: " in view(nb, bad_option) and "non-zero" in view(nb, bad_option)


def test_keras_training(tmp_path):
    nb = execute("keras_training.ipynb", tmp_path)
    define, runner, cell = code_cells(nb)
    assert not errors(define)
    runner_accuracy = float(re.search(r"HorovodRunner: test accuracy (0\.\d+)",
                                      view(nb, runner)).group(1))
    assert runner_accuracy > 0.8  # a trained model, not chance (0.1)
    shown = view(nb, cell)
    # (a dashboard shows a line twice: in its table and in the rank's log)
    accuracies = dict(re.findall(r"rank (\d): test accuracy (0\.\d+)", shown))
    assert sorted(accuracies) == ["0", "1"]
    assert accuracies["0"] == accuracies["1"]  # the same weights on both ranks
    assert float(accuracies["0"]) > 0.8
    assert "loss:" in shown  # Keras' own progress on rank 0
    assert len(results(cell)) == 1 and float(results(cell)[0]) > 0.8


def test_every_notebook_is_tested():
    names = sorted(n for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb"))
    tested = sorted(name[len("test_"):] + ".ipynb" for name in globals()
                    if name.startswith("test_") and name[len("test_"):] + ".ipynb" in names)
    assert names == tested


def test_notebooks_in_git_have_no_outputs():
    """What git holds, committed and staged (not the working copy, which Jupyter may have saved)."""
    listed = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    assert "notebooks/quickstart.ipynb" in listed
    dirty = set()
    for path in listed:
        for version in (f"HEAD:{path}", f":{path}"):
            blob = subprocess.run(["git", "show", version], cwd=ROOT, capture_output=True, text=True)
            if blob.returncode:  # staged, not committed yet
                continue
            nb = json.loads(blob.stdout)
            if "widgets" in nb.get("metadata", {}) or any(
                    cell.get("outputs") or cell.get("execution_count")
                    for cell in nb["cells"] if cell["cell_type"] == "code"):
                dirty.add(path)
    assert not dirty, f"strip the outputs of {sorted(dirty)} (Edit > Clear Outputs of All Cells)"


def test_interactive_session(tmp_path):
    nb = execute("interactive_session.ipynb", tmp_path)
    start, build, _, define, inspect, _, train_more, check, plot, stop = code_cells(nb)
    assert "2 ranks on driver only" in view(nb, start)
    shown = view(nb, build)
    assert "rank 0: 899 samples" in shown and "rank 1: 898 samples" in shown
    first = float(results(define)[0])
    shown = view(nb, inspect)
    assert "rank 0: 20 steps so far, weights equal across ranks: True" in shown
    assert float(results(inspect)[0]) == first  # the ranks kept their state between cells
    assert float(results(train_more)[0]) < first  # training went on from where it was
    # `train` lives on the ranks; the notebook's new lr reached it with `train(60)`
    assert float(results(check)[0]) == 0.5
    assert "rank 1: learning rate 0.5" in view(nb, check)
    assert "80 steps" in view(nb, plot)
    assert any("image/png" in o.get("data", {}) for o in plot.outputs)
    assert "stopped" in view(nb, stop)


def test_spark_data(tmp_path):
    nb = execute("spark_data.ipynb", tmp_path)
    (read, train, after, write, direct, start, first, second, stop, make_big,
     stream) = code_cells(nb)
    assert re.search(r"^569 rows, 31 columns; malignant: 212", view(nb, read), re.M)
    shown = view(nb, train)
    assert "--data: 2 shards of 284 rows each (--equal-shards dropped 1 of 569 rows), converted " \
           "once" in shown
    assert "rank 0: 284 rows" in shown and "rank 1: 284 rows" in shown
    assert not errors(train) and float(results(train)[0]) > 0.95  # a trained model, not chance
    assert "rows per shard: [28" in view(nb, after) and not errors(after)
    assert "522 rows with f0 > 10" in view(nb, write)
    shown = view(nb, direct)
    assert "--data: 522 rows in 2 shards of 261 rows each, read directly from" in shown
    assert "rank 0: 261 rows, 9 batches (batch_count: 9)" in shown
    assert "rank 1: 261 rows, 9 batches (batch_count: 9)" in shown
    shown = view(nb, first)
    assert "569 rows in 2 shards of 284 to 285 rows, reused" in shown
    assert "rank 0: 284 rows" in shown and "rank 1: 285 rows" in shown
    shown = view(nb, second)
    assert "rank 0: still 284 rows, 5 batches" in shown and "rank 1: still 285 rows, 5 batches" in shown
    assert not errors(stop) and not errors(make_big)
    shown = view(nb, stream)
    for rank in range(2):
        assert re.search(rf"rank {rank}: streamed a 61 MiB shard twice; memory grew \d+ MiB "
                         r"after the first batch \(under a quarter of the shard: True\)", shown)
    assert not errors(stream)
    # nothing red that is not an error: the JVM's lines go to its log, Spark draws no progress
    # bars, and hvd_magic's own news (--data's shards) is not stderr
    for cell in code_cells(nb):
        red = [out.text for out in cell.outputs
               if out.output_type == "stream" and out.name == "stderr"]
        assert not red, (cell.source.splitlines()[:2], red)


def test_scripts_and_mlflow(tmp_path):
    nb = execute("scripts_and_mlflow.ipynb", tmp_path)
    _, write, tracking, run, checkpoint, mlflow_run, terminal = code_cells(nb)
    assert not any(errors(c) for c in code_cells(nb))
    assert "saved checkpoint.pt after 200 steps" in view(nb, run)
    assert "w = 3.0, b = 1.0" in view(nb, checkpoint)
    shown = view(nb, mlflow_run)
    assert "FINISHED np = 2 script = train.py" in shown
    points, last = re.search(r"(\d+) loss points, the last (\S+)", shown).groups()
    assert int(points) == 200 and float(last) < 0.001
    assert "'train.py'" in shown and "'run'" in shown
    shown = view(nb, terminal)
    assert "exit code 0" in shown and "done in" in shown and "rank 1 on" in shown


def test_elastic(tmp_path):
    nb = execute("elastic.ipynb", tmp_path)
    _, train, history = code_cells(nb)
    assert not any(errors(c) for c in code_cells(nb))
    # (a dashboard shows a line twice: in its table and in the rank's log)
    starts = {int(rank): [int(s) for s in steps.split(", ")] for rank, steps in re.findall(
        r"rank (\d) of 3: step 200; the loop started at steps \[([\d, ]+)\]", view(nb, train))}
    assert sorted(starts) == [0, 1, 2]
    survivors = sorted(s for s in starts.values() if s[0] == 0)
    replacement = [s for s in starts.values() if s[0] != 0]
    shown = view(nb, history)
    assert "3 results, at step 200; weights equal: True" in shown
    lost = re.findall(r"rank (\d) lost \(hvd-s\d-a1, killed by SIGKILL\)", shown)
    joined = re.findall(r"rank (\d) joined \(attempt 2, hvd-s\d-a2\)", shown)
    # the rare case the text names: a survivor aborted by Gloo (Horovod #2484), replaced too
    aborted = re.findall(r"rank (\d) lost \(hvd-s\d-a1, killed by SIGABRT\)", shown)
    assert len(lost) == 1 and sorted(joined) == sorted(lost + aborted), shown
    assert re.search(r"^the ring: 3( → \d)* → 3$", shown, re.M), shown
    assert survivors and all(s[:2] == [0, 40] for s in survivors), starts
    assert any("image/png" in o.get("data", {}) for o in history.outputs)  # the ring drawn
    if aborted:
        return
    # the survivors: from 0, then from 40 (the commit before the kill at 45), then from the
    # commit at which the replacement joined, where the replacement began
    assert len(survivors) == 2 and survivors[0] == survivors[1], starts
    assert len(replacement) == 1, starts
    joined_at = replacement[0][0]
    assert replacement == [[joined_at]] and survivors[0][2:] == [joined_at], starts
    assert joined_at % 10 == 0 and joined_at > 40
    assert "the ring: 3 → 2 → 3" in shown


def test_beyond_horovod(tmp_path):
    """What the text promises of each of the five cells: the same dashboard (each rank done,
    its 60 steps as progress, a loss chart: `hvd_magic.report`'s, Lightning's `self.log`) and
    the same test accuracy (Horovod, DDP, Lightning, DeepSpeed, JAX)."""
    nb = execute("beyond_horovod.ipynb", tmp_path, dashboard_at_once=True)
    define, *ways = code_cells(nb)
    assert not errors(define) and len(ways) == 5  # Horovod, DDP, Lightning, DeepSpeed, JAX
    assert "all five reach a test accuracy of 0.970" in nb.cells[0].source
    assert "with the same dashboard" in nb.cells[0].source
    for cell in ways:
        shown = view(nb, cell)
        assert not errors(cell), shown
        assert results(cell) == ["0.97"]  # rank 0's value: the number the text promises
        for rank in (0, 1):
            assert f"rank {rank}: test accuracy 0.970" in shown
        assert "hvd-magic-run" in shown, shown
        assert sorted(re.findall(r"<tr data-rank='(\d)' data-state='done' data-step='60' "
                                 r"data-total='60'>", shown)) == ["0", "1"], shown
        assert '<img alt="loss"' in shown, shown  # its chart, in the finished dashboard


def test_debugging(tmp_path):
    nb = execute("debugging.ipynb", tmp_path)
    _, hang, found, magic, cancel, failing, frames = code_cells(nb)
    assert not errors(hang)
    # Its dashboard was shown, Stacks button and all (the text points at it), and once the run
    # was cancelled it became the static rendition, its value saying so (no stale "running").
    state = nb.metadata["widgets"][WIDGET_STATE]["state"]
    assert "Stacks" in [m["state"].get("description") for m in state.values()
                        if m["model_name"] == "ButtonModel"]
    shown = view(nb, hang)
    assert "hvd-magic-run" in shown and "cancelled" in shown, shown
    assert re.search(r"<Run \S+ np=2 cancelled>", shown) and "running>" not in shown, shown
    for shown in (view(nb, found), view(nb, magic)):  # run.stacks(), then %horovod_stacks
        assert "rank 0: Cell In[" in shown and "→ allreduce" in shown, shown
        assert "rank 1: Cell In[" in shown and "in load_batch" in shown, shown
    assert view(nb, cancel).strip() == "cancelled"
    assert [e.ename for e in errors(failing)] == ["RankError"]
    assert "rank 1" in view(nb, failing) and "ZeroDivisionError" in view(nb, failing)
    train_step, scale_batch = view(nb, frames).splitlines()  # (and the cell's functions)
    assert train_step.startswith("train_step: {'step': 5, 'batch': [5, 6, 7]"), train_step
    assert scale_batch.startswith("scale_batch: {'batch': [5, 6, 7], 'factor': 2"), scale_batch


def test_sweeps(tmp_path):
    nb = execute("sweeps.ipynb", tmp_path)
    _, _, sweep_cell, table, best = code_cells(nb)
    shown = view(nb, sweep_cell)
    assert not errors(sweep_cell), shown
    assert "stopped at step" in shown  # lr=0.001 falls behind: stopped, not failed
    assert "best: trial 0 (lr=0.1)" in shown  # the finished view the saved notebook keeps
    rows = view(nb, table)
    assert "0.100" in rows and "done" in rows and "stopped" in rows
    assert "<best trial 0: lr=0.1" in view(nb, best) and "rerun: done lr 0.1" in view(nb, best)
    folder = next((tmp_path / "hvd_runs").glob("sweep-*"))
    assert {"trial-0", "trial-1", "trial-2", "trials.csv"} <= set(os.listdir(folder))
