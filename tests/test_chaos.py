"""A seeded slice of the faults-at-random harness (bench/chaos.py; the long soak stays there):
rounds whose moments the seed draws in turn from init (in the rank's start), early and late, on
the driver and on local Spark, each checked as the harness checks every round: its fault
struck, it ended within its deadline and its fault's bound, its error names its cause, nothing
of the run outlived it (processes, folders, value files, cgroups, jobs, ports), every rank's log
is kept. A failing round names its seed. And what the harness's checks look for, shown to find
it; and a second notebook's ranks, untouched by the first's cancel."""

import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import chaos  # noqa: E402
import chaos_faults  # noqa: E402
import chaos_leaks  # noqa: E402
import chaos_table  # noqa: E402
from chaos_neighbour import Neighbour  # noqa: E402

SEED = 7
SLICE = chaos.slice_rounds(SEED, 3)


@pytest.mark.parametrize("round_", SLICE, ids=[f"{r['launcher']}-{r['program']}-{r['fault']}-"
                                               f"{r['moment']}" for r in SLICE])
def test_a_round_with_a_fault_at_a_seeded_moment_strikes_ends_and_leaves_nothing(ip, round_):
    if round_["fault"] == "oom" and chaos_faults.memory_cgroup_parent() is None:
        pytest.skip("the oom fault needs a writable memory cgroup (v1, or v2's controller)")
    outcome = chaos.play(ip, round_)
    replay = (f"bench/chaos.py --slice --seed {SEED} --only {round_['round']} (moment "
              f"{round_['moment']}, at step {round_['at_step']})")
    assert outcome["ok"], (replay, outcome["problems"], outcome)
    if round_["fault"] != "none":
        assert outcome["struck"], ("the fault never struck", outcome["unstruck"], replay)


def test_the_slice_draws_every_moment_on_the_driver_and_on_spark():
    assert {r["moment"] for r in SLICE} == set(chaos.MOMENTS)
    assert {r["launcher"] for r in SLICE} == {"driver", "spark"}
    assert chaos.slice_rounds(SEED, 3) == SLICE  # (the seed draws them: a replay is the same)


def test_freeze_with_an_elastic_run_is_drawn():
    drawn = {(r["program"], r["fault"]) for r in
             (chaos.draw(1, n, ["driver"], ["elastic"], ["freeze", "none"]) for n in range(20))}
    assert ("elastic", "freeze") in drawn


def test_a_round_whose_fault_never_struck_counts_as_nothing():
    rounds = [{"seed": 1, "round": 0, "fault": "kill", "launcher": "driver", "program": "ddp",
               "struck": False, "ok": True, "problems": [], "seconds": 1.0},
              {"seed": 1, "round": 1, "fault": "kill", "launcher": "driver", "program": "ddp",
               "struck": True, "ok": True, "problems": [], "seconds": 1.0, "to_error": 0.4,
               "bound": 10.0}]
    checks, _, times = chaos_table.tables(rounds)
    assert "| kill | driver | 1 | 1 | ddp 1 |" in checks  # (1 counted, 1 unstruck)
    assert "| kill | driver | 1 | 0.4 | 0.4 | 0.4 | 10 | 0 |" in times


class _Run:
    def __init__(self, run_id, pids=()):
        self.id, self.membership = run_id, []
        self.ranks = [type("Rank", (), {"pid": p})() for p in pids]


def test_the_leak_checks_find_a_runs_folder_value_file_and_process_group(tmp_path):
    record = chaos_leaks.Record()
    value = tmp_path / "hvd_magic-value-x"
    value.write_bytes(b"1")
    record.values.add(str(value))
    (tmp_path / "hvd_magic-RUNID-rank0-abc").mkdir()
    (tmp_path / "hvd_magic-OTHER-rank0-abc").mkdir()  # (another run's: not this one's leak)
    found = chaos_leaks.files_left("RUNID", record, temp=str(tmp_path))
    assert [p.split(":")[0] for p in found] == ["leak folders", "leak shm"]
    assert "OTHER" not in " ".join(found)
    # a rank that led its own group, and a child of it that outlived it
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    try:
        time.sleep(0.3)
        record.ranks([leader.pid])
        leader.kill()
        leader.wait()
        left = chaos_leaks.leftovers(_Run("RUNID-no-process-names-it"), record)
        assert left, "the child in the rank's process group was not found"
        assert chaos_leaks.left_behind(lambda: chaos_leaks.leftovers(
            _Run("RUNID-no-process-names-it"), record), 0.5)[0].startswith("leak processes")
    finally:
        for pid in chaos_leaks._in_groups({leader.pid: record.groups.get(leader.pid)}):
            os.kill(pid, signal.SIGKILL)


def test_the_cut_is_refused_without_network_namespaces(monkeypatch):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
    import simhosts
    monkeypatch.setattr(simhosts, "unavailable", lambda: "no namespaces here")
    assert chaos.refused(["cut", "kill"]) == {"cut": "no namespaces here"}


def test_a_second_notebooks_ranks_outlive_the_first_notebooks_cancel_and_end(ip):
    """Two notebooks on one machine: the first's cancel and its run's end touch only its own
    ranks; the second's (an IPython process of its own) go on and end as their own."""
    beside = Neighbour(seed=0, number=0, cancel_at=0)  # (it runs until it is told to stop)
    try:
        assert beside.wait_started(), "the second notebook's run never started"
        run = ip.run_cell_magic("distributed", "--np -2 --background --quiet",
                                "import time\nfor _ in range(600):\n    time.sleep(0.05)")
        while run.state == "running" and not all(r.pid for r in run.ranks):
            time.sleep(0.05)
        run.cancel()
        with pytest.raises(Exception):
            run.wait(60)
        assert run.state == "cancelled"
        assert beside.finish() == []
        again = Neighbour(seed=0, number=1, cancel_at=0)  # (the next round's, in its shell)
        assert again.process is beside.process and again.wait_started()
        assert again.finish() == []
    finally:
        if beside.process.poll() is None:
            beside.process.kill()
            beside.process.wait()


def test_the_table_is_remade_from_the_committed_outputs(tmp_path):
    outputs = chaos_table.committed()
    if not outputs:
        pytest.skip("no committed soak outputs (bench/soak/*.jsonl.gz)")
    text = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "..",
                                                        "bench", "chaos.py"), "--table"],
                          capture_output=True, text=True, check=True).stdout
    reliability = open(os.path.join(os.path.dirname(__file__), "..", "RELIABILITY.md")).read()
    assert text.strip() in reliability, "RELIABILITY.md's tables are not --table's"




def test_the_soak_plays_every_pair_each_cycle_a_launcher_at_a_time():
    import chaos_soak
    played = chaos_soak.pairs(list(chaos.LAUNCHERS), list(chaos.PROGRAMS), list(chaos.FAULTS),
                              chaos.NOT_ON)
    assert ("cluster", "elastic", "freeze") in played and ("driver", "ddp", "task") not in played
    assert ("driver", "session", "notebook") not in played
    rounds = [chaos_soak.pair_of(3, n, played) for n in range(2 * len(played))]
    for cycle in (rounds[:len(played)], rounds[len(played):]):
        assert sorted(cycle) == sorted(played)  # (every pair, once a cycle)
    switches = sum(a[0] != b[0] for a, b in zip(rounds, rounds[1:]))
    assert switches == 2 * (len(chaos.LAUNCHERS) - 1)  # (and the cycles meet on one launcher)


def test_the_soak_resumes_its_output_and_refuses_another_commits(tmp_path):
    import types
    import chaos_soak
    output = str(tmp_path / "soak.jsonl.gz")
    playing = []

    def played(ip, round_, out, output):  # (what each round would give: struck, ok)
        playing.append(round_["round"])
        outcome = dict(round_, struck=True, ok=True, problems=[], commit="abc1234")
        chaos_table.write(output, outcome)
        return outcome
    harness = types.SimpleNamespace(refused=lambda faults: {}, NOT_ON=chaos.NOT_ON,
                                    draw=chaos.draw, _played=played, finished=lambda: None)
    soak = dict(launchers=["driver"], programs=["ddp"], faults=["kill", "cancel"], timeout=20,
                neighbours=0.0, out=open(os.devnull, "w"))
    chaos_soak.soak(harness, None, 5, 3, output, **soak)
    assert playing == [0, 1, 2]
    chaos_soak.soak(harness, None, 5, 5, output, **soak)  # (a second sitting)
    assert playing == [0, 1, 2, 3, 4]
    assert [o["round"] for o in chaos_table.outcomes_in(output)] == [0, 1, 2, 3, 4]
    assert chaos_soak.resumable(output, "abc1234", 5) is None
    assert "commit" in chaos_soak.resumable(output, "def5678", 5)
    assert "seed" in chaos_soak.resumable(output, "abc1234", 6)


def test_a_check_made_later_takes_no_partial_folder_of_the_next_round(tmp_path, monkeypatch):
    """A killed notebook's files are looked for while the next round runs: a partial cache
    folder that round makes is not this round's leak; one this round left is."""
    monkeypatch.setattr(chaos_leaks, "_parts", lambda: sorted(
        str(p) for p in tmp_path.glob("*.part-*")))
    record = chaos_leaks.Record()
    (tmp_path / "ours.part-1").mkdir()  # (left by this round)
    parts = chaos_leaks.new_parts(record)  # (taken as its ranks were gone)
    (tmp_path / "next.part-2").mkdir()  # (the next round's, made meanwhile)
    found = chaos_leaks.files_left("RUNID", record, temp=str(tmp_path), parts=parts)
    assert found == [f"leak parts: {tmp_path / 'ours.part-1'}"]


def test_a_partial_folder_another_process_is_making_is_no_leak(tmp_path, monkeypatch):
    """The shipped cache is the host's: a part whose maker holds its entry's lock (another
    notebook making that entry as the round ends) is not the round's leak; once no one makes
    it, it is."""
    import fcntl
    monkeypatch.setattr(chaos_leaks, "_parts", lambda: sorted(
        str(p) for p in tmp_path.glob("*.part-*")))
    record = chaos_leaks.Record()
    (tmp_path / "pkg-1.0-abc.part-1234").mkdir()
    with open(tmp_path / "pkg-1.0-abc.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (its maker, making it)
        assert chaos_leaks.files_left("RUNID", record, temp=str(tmp_path)) == []
        fcntl.flock(lock, fcntl.LOCK_UN)
    found = chaos_leaks.files_left("RUNID", record, temp=str(tmp_path))
    assert found == [f"leak parts: {tmp_path / 'pkg-1.0-abc.part-1234'}"]
