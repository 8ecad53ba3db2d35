"""Sweeps with real rank processes: a grid whose trials' ranks saw their own values, gangs
sharing the slots (overlapping when they hold them, queued when not), a trial stopped early on
every rank at the same step, a failing trial beside finishing ones, a cancelled sweep with no
process left, and the table equal to the trials' own results. Through the API and the magic,
on the driver launcher (``np=-2``) and on Spark (``np=2``)."""

import os
import sys
import time

import cloudpickle
import pytest
from IPython.core.error import UsageError

import hvd_magic
from hvd_magic.sweeps.space import grid, parse_space, random_points
from hvd_magic.sweeps.view import state_text

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # (the ranks cannot import tests/)


def train(lr, width=0, steps=5, fail_at=None, pause=0.05):
    """Reports `lr * 10 / step` as its loss; each rank writes the steps it reached."""
    import os
    import time

    import hvd_magic
    rank = int(os.environ["RANK"])
    for step in range(1, steps + 1):
        if fail_at is not None and lr == fail_at:
            raise ValueError(f"lr {lr} diverged")
        time.sleep(pause)
        with open(f"steps-{lr}-{width}-{rank}.txt", "a") as f:
            f.write(f"{step}\n")
        hvd_magic.report(step=step, loss=lr * 10 / step)
    return {"lr": lr, "width": width, "rank": rank, "pid": os.getpid()}


def lockstep(lr, steps=40):
    """torch.distributed's allreduce every step (the ranks in lockstep), rank 1 slower."""
    import time

    import torch
    import torch.distributed as dist

    import hvd_magic
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(1, steps + 1):
        total = torch.tensor([lr])
        dist.all_reduce(total)
        time.sleep(0.03 if rank == 0 else 0.06)
        with open(f"steps-{lr}-{rank}.txt", "a") as f:
            f.write(f"{step}\n")
        hvd_magic.report(step=step, loss=float(total.item()))
    return "finished"


def last_step(name):
    return int(open(name).read().split()[-1])


def test_the_sweep_text_reads_as_a_grid():
    space = parse_space("lr=1e-3,1e-2; width=64,128; opt=adam")
    assert space == {"lr": [1e-3, 1e-2], "width": [64, 128], "opt": ["adam"]}
    assert len(grid(space)) == 4 and grid(space)[1] == {"lr": 1e-3, "width": 128, "opt": "adam"}
    assert len(random_points({"lr": (1e-4, 1e-1), "width": [1, 2]}, 5, seed=1)) == 5
    for bad in ("lr", "lr=", "1x=2", "lr=1;lr=2"):
        with pytest.raises(UsageError):
            parse_space(bad)


def test_the_stopping_rules_stop_the_trial_that_falls_behind():
    from hvd_magic.sweeps.stopping import ASHA, MedianStopping, make_rule
    curves = {0: [(s, 1.0) for s in range(1, 10)], 1: [(s, 2.0) for s in range(1, 10)],
              2: [(s, 5.0) for s in range(1, 4)]}
    median = MedianStopping(grace=3)
    assert median.should_stop(2, curves, "min") and not median.should_stop(0, curves, "min")
    assert not median.should_stop(2, curves, "max")  # the largest is the best there
    assert not MedianStopping(grace=5).should_stop(2, curves, "min")  # too early
    asha = ASHA(grace=1, eta=3)  # rungs at steps 1, 3, 9: the top third goes on
    # (at step 9 only two trials so far: too few to cut; at step 3 trial 2 is the worst of 3)
    assert [asha.should_stop(n, curves, "min") for n in (0, 1, 2)] == [False, False, True]
    assert isinstance(make_rule("asha:2"), ASHA) and make_rule(None) is None
    with pytest.raises(UsageError, match="median or asha"):
        make_rule("hyperband")


def test_each_trials_ranks_see_its_values_and_gangs_overlap():
    sweep = hvd_magic.sweep(train, np=-2, params={"lr": [0.1, 0.2], "width": [64, 128]},
                            slots=4, kwargs={"pause": 0.2})
    assert [t.state for t in sweep.trials] == ["done"] * 4
    for trial in sweep.trials:
        assert [(r["lr"], r["width"], r["rank"]) for r in trial.run.results] == [
            (trial.values["lr"], trial.values["width"], 0),
            (trial.values["lr"], trial.values["width"], 1)]
    runs = [t.run for t in sweep.trials]
    # two trials of two ranks at once on four slots: the first two overlap, the third waited
    assert runs[0].started < runs[1].ended and runs[1].started < runs[0].ended
    assert runs[2].started >= min(runs[0].ended, runs[1].ended)
    # the table is the trials' own results, and the folder holds each run and the table
    table = sweep.table()
    assert list(table["lr"]) == [0.1, 0.1, 0.2, 0.2]
    assert list(table["loss"]) == pytest.approx([0.2, 0.2, 0.4, 0.4])
    assert list(table["run"]) == [r.id for r in runs]
    assert sweep.best.values in ({"lr": 0.1, "width": 64}, {"lr": 0.1, "width": 128})
    for run in runs:
        assert os.path.dirname(run.run_dir) == sweep.folder
    assert {"trials.csv", "trials.json"} <= set(os.listdir(sweep.folder))
    assert hvd_magic.last_sweep() is sweep


def test_trials_wait_for_a_whole_gang_of_slots():
    sweep = hvd_magic.sweep(train, np=-2, params={"lr": [0.1, 0.2]}, slots=3,
                            background=True, kwargs={"pause": 0.3})
    seen = set()
    while not sweep.ended_within(0.05):
        seen.add((sweep.trials[1].state, sweep.trials[1].waiting_for))
    assert ("waiting", "2 cores, 1 free") in seen
    first, second = (t.run for t in sweep.trials)
    assert second.started >= first.ended  # never half of its slots


def test_a_stopped_trial_leaves_on_every_rank_at_the_same_step():
    sweep = hvd_magic.sweep(lockstep, np=-2, params={"lr": [1.0, 2.0, 10.0]}, slots=4,
                            trials_at_once=2, early_stop="median:3")
    states = [t.state for t in sweep.trials]
    assert states[:2] == ["done", "done"] and states[2] == "stopped"
    stopped = sweep.trials[2]
    assert stopped.stopped_at is not None and 3 <= stopped.stopped_at < 40
    assert [last_step(f"steps-10.0-{r}.txt") for r in range(2)] == [stopped.stopped_at] * 2
    assert stopped.run.state == "done" and stopped.error is None
    assert state_text(stopped) == f"stopped at step {stopped.stopped_at}"  # not a failure


def test_a_failing_trial_is_a_row_and_the_others_finish():
    sweep = hvd_magic.sweep(train, np=-2, params={"lr": [0.1, 0.2, 0.3]}, slots=4,
                            kwargs={"fail_at": 0.2})
    assert [t.state for t in sweep.trials] == ["done", "failed", "done"]
    row = sweep.table().loc[1]
    assert "lr 0.2 diverged" in row["error"]
    with pytest.raises(Exception, match="diverged"):
        hvd_magic.sweep(train, np=-2, params={"lr": [0.2, 0.1]}, slots=2, fail_fast=True,
                        kwargs={"fail_at": 0.2})
    assert [t.state for t in hvd_magic.last_sweep().trials] == ["failed", "cancelled"]


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def cancel_once_two_run(sweep, wait=120):
    """Cancel a background sweep of three trials once the first two's ranks all started;
    check that every trial ended cancelled, the third never started, no rank process is left."""
    deadline = time.monotonic() + wait
    while not all(t.run is not None and all(r.pid for r in t.run.ranks)
                  for t in sweep.trials[:2]) and time.monotonic() < deadline:
        time.sleep(0.1)
    pids = [r.pid for t in sweep.trials[:2] for r in t.run.ranks]
    sweep.cancel()
    assert sweep.ended_within(60)
    assert [t.state for t in sweep.trials] == ["cancelled"] * 3
    assert sweep.trials[2].run is None
    time.sleep(0.5)
    assert [p for p in pids if _alive(p)] == []


def test_a_cancelled_sweep_leaves_no_process():
    cancel_once_two_run(hvd_magic.sweep(
        train, np=-2, params={"lr": [0.1, 0.2, 0.3]}, slots=4, background=True,
        kwargs={"steps": 1000, "pause": 0.05}))


def test_the_best_trial_reruns_at_another_size():
    sweep = hvd_magic.sweep(train, np=-2, params={"lr": [0.3, 0.1]}, slots=4)
    run = sweep.best.rerun(np=-3, view=None)
    assert sweep.best["lr"] == 0.1
    assert [r["lr"] for r in run.results] == [0.1] * 3


SWEEP_CELL = """\
import os, hvd_magic
for step in range(1, 4):
    hvd_magic.report(step=step, loss=lr * width / step)
(lr, width, int(os.environ["RANK"]))
"""


def test_the_magic_sweeps_the_cells_free_names(ip, fresh_ns, capsys):
    fresh_ns["lr"], fresh_ns["width"] = 5.0, 1  # the notebook's own: what a single run uses
    ip.run_cell_magic("horovod", '--np -2 --text --sweep "lr=0.1,0.2; width=2"', SWEEP_CELL)
    sweep = hvd_magic.last_sweep()
    assert [t.run.results for t in sweep.trials] == [
        [(0.1, 2, 0), (0.1, 2, 1)], [(0.2, 2, 0), (0.2, 2, 1)]]
    out = capsys.readouterr().out
    assert "best: trial 0 (lr=0.1, width=2)" in out
    assert ip.run_cell_magic("horovod", "--np -2 --quiet", SWEEP_CELL) == (5.0, 1, 0)


def test_the_magic_refuses_what_cannot_sweep(ip, fresh_ns):
    with pytest.raises(UsageError, match="never reads momentum"):
        ip.run_cell_magic("horovod", '--np -2 --sweep "momentum=0.9"', SWEEP_CELL)
    with pytest.raises(UsageError, match="belongs to a sweep"):
        ip.run_cell_magic("horovod", "--np -2 --trials-at-once 2", SWEEP_CELL)
    with pytest.raises(UsageError, match="not name=value"):
        ip.run_cell_magic("horovod", '--np -2 --sweep "lr"', SWEEP_CELL)


# -- on Spark: the trials are barrier stages of one session, sharing its task slots ------------

def test_spark_trials_share_the_task_slots_and_see_their_values():
    from conftest import spark_session
    spark_session(4)
    sweep = hvd_magic.sweep(train, np=2, params={"lr": [0.1, 0.2, 0.3]},
                            kwargs={"pause": 0.3})
    assert (sweep.slots.total, sweep.slots.what) == (4, "Spark task slots")
    assert [[(r["lr"], r["rank"]) for r in t.run.results] for t in sweep.trials] == [
        [(lr, 0), (lr, 1)] for lr in (0.1, 0.2, 0.3)]
    first, second, third = (t.run for t in sweep.trials)
    assert first.started < second.ended and second.started < first.ended
    assert third.started >= min(first.ended, second.ended)


def test_spark_a_stopped_trial_leaves_on_every_rank_at_the_same_step():
    from conftest import spark_session
    spark_session(4)
    sweep = hvd_magic.sweep(lockstep, np=2, params={"lr": [1.0, 2.0, 10.0]},
                            trials_at_once=2, early_stop="median:3")
    stopped = sweep.trials[2]
    assert [t.state for t in sweep.trials] == ["done", "done", "stopped"]
    assert [last_step(f"steps-10.0-{r}.txt") for r in range(2)] == [stopped.stopped_at] * 2


def imports_optuna(lr, steps=30):
    """`lockstep`'s loop without torch; says whether this rank has Optuna loaded."""
    import sys
    import time

    import hvd_magic
    for step in range(1, steps + 1):
        time.sleep(0.03)
        hvd_magic.report(step=step, loss=lr)
    return "optuna" in sys.modules


def test_an_optuna_study_asks_the_values_and_its_pruner_stops_a_trial():
    optuna = pytest.importorskip("optuna")
    study = optuna.create_study(pruner=optuna.pruners.MedianPruner(n_startup_trials=2,
                                                                   n_warmup_steps=3))
    for lr in (1.0, 2.0, 10.0):  # (asked in this order: a test needs to know the bad one)
        study.enqueue_trial({"lr": lr})
    sweep = hvd_magic.sweep(imports_optuna, np=-2, params={"lr": [1.0, 2.0, 10.0]},
                            search=study, trials=3, trials_at_once=1, slots=2)
    assert [t.values for t in sweep.trials] == [{"lr": 1.0}, {"lr": 2.0}, {"lr": 10.0}]
    assert [t.state for t in sweep.trials] == ["done", "done", "stopped"]
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert [t.value for t in study.trials[:2]] == [1.0, 2.0]
    assert sweep.trials[0].run.results == [False, False]  # the ranks never imported Optuna
    with pytest.raises(UsageError, match="mode='min'"):
        hvd_magic.sweep(imports_optuna, np=-2, params={"lr": [1.0]}, search=study, mode="max")


def test_a_tracked_sweep_is_a_parent_run_with_a_nested_run_per_trial(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        sweep = hvd_magic.sweep(train, np=-2, params={"lr": [0.1, 0.2]}, slots=4,
                                mlflow="sweeps", name="lr sweep")
        client = mlflow.MlflowClient()
        experiment = client.get_experiment_by_name("sweeps")
        runs = client.search_runs([experiment.experiment_id])
        [parent] = [r for r in runs if r.info.run_name == "lr sweep"]
        children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert sorted(r.info.run_name for r in children) == ["trial 0", "trial 1"]
        assert parent.info.status == "FINISHED"
        assert parent.data.params["space.lr"] == "[0.1, 0.2]"
        assert parent.data.metrics["best loss"] == pytest.approx(0.2)
        assert [t.state for t in sweep.trials] == ["done", "done"]
    finally:
        mlflow.set_tracking_uri(before)


def test_an_interrupt_cancels_the_sweep_and_leaves_no_process():
    import signal
    import threading

    pids, before = [], hvd_magic.last_sweep()

    def interrupt_once_running():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            sweep = hvd_magic.last_sweep()
            running = [t for t in (sweep.trials if sweep is not before else ())
                       if t.run is not None]
            if running and all(r.pid for r in running[0].run.ranks):
                pids.extend(r.pid for r in running[0].run.ranks)
                break
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)  # the kernel's interrupt

    threading.Thread(target=interrupt_once_running, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        hvd_magic.sweep(train, np=-2, params={"lr": [0.1, 0.2]}, slots=2,
                        kwargs={"steps": 1000})
    sweep = hvd_magic.last_sweep()
    assert [t.state for t in sweep.trials] == ["cancelled", "cancelled"]
    assert sweep.trials[1].run is None  # the waiting trial never started
    time.sleep(0.5)
    assert pids and [p for p in pids if _alive(p)] == []


def test_the_widget_view_shows_every_trial_and_stops_the_sweep():
    from hvd_magic.sweeps.view import WidgetSweepView
    view = WidgetSweepView(background=True)
    sweep = hvd_magic.sweep(train, np=-2, params={"lr": [0.1, 0.2, 0.3]}, slots=2,
                            background=True, view=view, kwargs={"steps": 1000})
    assert [label for label, _ in view.picker.options] == ["0: lr=0.1", "1: lr=0.2", "2: lr=0.3"]
    deadline = time.monotonic() + 60
    while "<td>running</td>" not in view.page.value and time.monotonic() < deadline:
        time.sleep(0.1)  # (redrawn by the scheduler thread, twice a second at most)
    assert view.page.value.count("waiting (2 cores, 0 free)") == 2
    view.stop_all.click()
    assert sweep.ended_within(60)
    assert [t.state for t in sweep.trials] == ["cancelled"] * 3
    assert view.page.value.count("<td>cancelled</td>") == 3  # the finished view


def gpus_seen(lr):
    import os
    import time
    time.sleep(0.5)
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_each_trials_ranks_get_gpus_of_their_own(monkeypatch):
    # This machine has no GPU: the driver's CUDA_VISIBLE_DEVICES names four (ids only: the
    # ranks never touch CUDA), as on a 4-GPU machine.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    sweep = hvd_magic.sweep(gpus_seen, np=-2, params={"lr": [1, 2, 3]})
    assert (sweep.slots.total, sweep.slots.what) == (4, "GPUs")
    seen = [t.run.results for t in sweep.trials]
    assert seen[0] == [seen[0][0]] * 2 and seen[1] == [seen[1][0]] * 2
    assert {seen[0][0], seen[1][0]} == {"0,1", "2,3"}  # side by side, on GPUs of their own
    first, second, third = (t.run for t in sweep.trials)
    assert first.started < second.ended and second.started < first.ended
    assert seen[2][0] in ("0,1", "2,3")  # after one ended, on the GPUs it gave back


def test_spark_a_failing_trial_beside_others_and_a_cancel_that_leaves_nothing():
    from conftest import spark_session
    spark_session(4)
    sweep = hvd_magic.sweep(train, np=2, params={"lr": [0.1, 0.2]}, kwargs={"fail_at": 0.2})
    assert [t.state for t in sweep.trials] == ["done", "failed"]
    assert "lr 0.2 diverged" in sweep.table().loc[1, "error"]
    cancel_once_two_run(hvd_magic.sweep(train, np=2, params={"lr": [0.1, 0.2, 0.3]},
                                        background=True, kwargs={"steps": 1000}))
