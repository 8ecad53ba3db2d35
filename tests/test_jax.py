"""JAX in a %%horovod cell: a bare ``jax.distributed.initialize()`` finds the launched world
(the coordinator on a port of its own, the process count and id from the launch registered as a
cluster JAX detects), and cross-process collectives over Gloo are exact; real ranks, real JAX.
"""

import gzip
import json
import os
import re
import time

import numpy as np
import pytest

import hvd_magic
from hvd_magic.timelines import ranks

pytest.importorskip("jax", reason="make setup installs JAX (the jax extra)")

# What a cell written for a JAX cluster does: initialize bare, gather across processes, and a
# jit over a global mesh whose psum adds every process's rows.
JAX_CELL = """\
import os
import numpy as np
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.distributed.initialize()
counts = (jax.process_count(), jax.process_index(), jax.device_count(), jax.local_device_count())
gathered = multihost_utils.process_allgather(np.array([jax.process_index() * 10 + 1]))
mesh = Mesh(np.array(jax.devices()), ("p",))
local = np.arange(4, dtype=np.float32).reshape(1, 4) + 100 * jax.process_index()
rows = jax.make_array_from_process_local_data(NamedSharding(mesh, P("p")), local)
total = jax.jit(lambda x: jnp.sum(x, axis=0),
                out_shardings=NamedSharding(mesh, P()))(rows)
summed = np.asarray(multihost_utils.process_allgather(total, tiled=True))
platform = jax.devices()[0].platform
"""
RESULT = "(counts, gathered.tolist(), summed.tolist(), platform)\n"


def assert_jax_world(results, n=2):
    reference = sum(np.arange(4, dtype=np.float32) + 100 * r for r in range(n))
    for rank, (counts, gathered, summed, platform) in enumerate(results):
        assert counts == (n, rank, n, 1)  # one CPU device per process, the process id its rank
        assert np.asarray(gathered).ravel().tolist() == [10 * r + 1 for r in range(n)]  # in order
        assert summed == reference.tolist()
        assert platform == "cpu"


@pytest.mark.parametrize("line", ["--np -2", "--np 2"])  # on the driver; on Spark local
def test_a_bare_jax_distributed_initialize_finds_the_launched_world(ip, line):
    ip.run_cell_magic("horovod", f"{line} --quiet", JAX_CELL + RESULT)
    assert_jax_world(hvd_magic.last_run().results)


def test_explicit_arguments_to_initialize_still_win(ip):
    """The coordinator named in the cell is the one used (a port of the cell's own choosing),
    the process count and id given explicitly are taken as given."""
    cell = JAX_CELL.replace(
        "jax.distributed.initialize()",
        "import socket\n"
        "coordinator = os.environ['JAX_COORDINATOR_ADDRESS'].rpartition(':')[0] + ':' + "
        "str(int(os.environ['HVD_MAGIC_TORCH_PORTS'].split(',')[1]))\n"
        "jax.distributed.initialize(coordinator, int(os.environ['WORLD_SIZE']), "
        "1 - int(os.environ['RANK']))")
    ip.run_cell_magic("horovod", "--np -2 --quiet", cell + "(jax.process_index(), os.environ['RANK'])\n")
    assert hvd_magic.last_run().results == [(1, "0"), (0, "1")]


def test_jax_does_not_take_torchs_port_and_both_run_in_one_cell(ip):
    """JAX's coordinator is on a port of its own: torch's rendezvous on MASTER_PORT still works
    (on the same port it fails with EADDRINUSE)."""
    cell = JAX_CELL + ("import torch, torch.distributed as dist\n"
                       "dist.init_process_group('gloo')\n"
                       "t = torch.tensor([float(dist.get_rank() + 1)]); dist.all_reduce(t)\n"
                       "(t.item(), os.environ['JAX_COORDINATOR_ADDRESS'] != "
                       "os.environ['MASTER_ADDR'] + ':' + os.environ['MASTER_PORT'])\n")
    ip.run_cell_magic("horovod", "--np -2 --quiet", cell)
    assert hvd_magic.last_run().results == [(3.0, True), (3.0, True)]


def test_a_killed_jax_rank_is_named_at_once(ip):
    """Rank 1 dies after initialize while rank 0 waits for it in a gather: the run names rank 1
    and its signal, from our channel, not JAX's heartbeat timeout (100 s) later."""
    cell = JAX_CELL.replace("gathered = ", "if jax.process_index() == 1:\n"
                            "    os.kill(os.getpid(), 9)\ngathered = ")
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -2 --quiet", cell + RESULT)
    text = "\n".join(info.value._render_traceback_())
    assert info.value.rank == 1 and "SIGKILL" in text, text
    assert "heartbeat" not in text.lower(), text


def test_a_warm_sessions_second_initialize_is_harmless(ip, fresh_ns):
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        ip.run_cell_magic("horovod", "--quiet", JAX_CELL + RESULT)
        first = hvd_magic.last_run().results
        ip.run_cell_magic("horovod", "--quiet", JAX_CELL + RESULT)  # initialize() again
        assert_jax_world(first)
        assert_jax_world(hvd_magic.last_run().results)
    finally:
        ip.run_line_magic("horovod_session", "stop")


@pytest.mark.parametrize("imports, words", [("import jax", "uses JAX"),
                                            ("import torch, deepspeed", "uses DeepSpeed")])
def test_an_elastic_run_of_jax_or_deepspeed_is_refused_with_what_to_do(ip, imports, words):
    from IPython.core.error import UsageError
    with pytest.raises(UsageError, match="Drop --min-np") as info:
        ip.run_cell_magic("horovod", "--np -2 --min-np 1 --quiet", imports + "\n1\n")
    assert words in str(info.value)


# Rank 1 sleeps in load_batch before the fourth gather; rank 0 waits for it in the gather.
JAX_SLEEPER = """\
import time
import numpy as np
import jax
from jax.experimental import multihost_utils
jax.distributed.initialize()
def load_batch(batch_id):
    time.sleep(120)
for step in range(4):
    if step == 3 and jax.process_index() == 1:
        load_batch(7)
    multihost_utils.process_allgather(np.ones(2))
"""


def test_jax_stacks_say_which_collective_each_rank_is_in(ip):
    """%horovod_stacks of a JAX cell: the waiting rank in process_allgather, the sleeper in its
    function, and where each is in JAX's waits: the sleeper one behind."""
    run = ip.run_cell_magic("horovod", "--np -2 --background --quiet", JAX_SLEEPER)
    try:
        deadline = time.monotonic() + 120
        while True:
            text = str(ip.run_line_magic("horovod_stacks", ""))
            if ("in load_batch" in text and "→ process_allgather" in text) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        run.cancel()
        with pytest.raises(hvd_magic.RunCancelled):
            run.wait(60)
    assert "rank 0: Cell In[" in text and "→ process_allgather" in text, text
    assert "rank 1: Cell In[" in text and "in load_batch" in text, text
    where = re.search(r"in collectives \(hvd_magic's count of JAX's waits\): rank 0 at #(\d+) "
                      r"process_allgather; rank 1 at #(\d+) process_allgather \(behind\)", text)
    assert where and int(where[1]) == int(where[2]) + 1, text


def test_a_jax_rank_stuck_on_a_stopped_peer_is_a_stall_in_its_collective(ip):
    """Rank 1 is stopped (SIGSTOP) before a jitted psum; rank 0 waits for the psum in
    block_until_ready: the stall names that wait, not "in no collective"."""
    cell = JAX_LOOP.replace("for step in range(1, 9):\n    if jax.process_index() == 1:\n"
                            "        time.sleep(0.1)\n",
                            "import os, signal\nfor step in range(1, 4):\n"
                            "    if step == 3 and jax.process_index() == 1:\n"
                            "        os.kill(os.getpid(), signal.SIGSTOP)\n")
    assert "SIGSTOP" in cell
    with pytest.raises(hvd_magic.RunStalled) as info:
        ip.run_cell_magic("horovod", "--np -2 --quiet --stall-timeout 3 --on-stall fail "
                                     "--timeout 200", cell)
    text = "\n".join(info.value._render_traceback_())
    assert re.search(r"rank 0 has been waiting in a collective \(jit\(", text), text
    assert "rank 1 is running elsewhere" in text, text


def test_a_rank_missing_from_jax_distributed_initialize_is_named(ip):
    """Rank 1 sleeps before initialize: rank 0's wait in it is reported as an init stall that
    names rank 1 and JAX's own timeout, not as a rank idle "in no collective"."""
    cell = ("import os, time\nimport jax\nif os.environ['RANK'] == '1':\n    time.sleep(90)\n"
            "jax.distributed.initialize()\n")
    with pytest.raises(hvd_magic.RunStalled) as info:
        ip.run_cell_magic("horovod", "--np -2 --quiet --stall-timeout 3 --on-stall fail "
                                     "--timeout 200", cell)
    text = "\n".join(info.value._render_traceback_())
    assert "rank 0 has been waiting in jax.distributed.initialize() for" in text, text
    assert "for rank 1, which has not called it" in text, text
    assert "JAX's initialization timeout" in text, text


# A JAX loop: a jitted shard_map psum each step, its steps reported; rank 1 sleeps before each,
# so it arrives last at every psum and rank 0 waits for it.
JAX_LOOP = """\
import time
import numpy as np
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import hvd_magic
jax.distributed.initialize()
mesh = Mesh(np.array(jax.devices()), ("p",))
add = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, "p"), mesh=mesh, in_specs=P("p"),
                            out_specs=P()))
rows = jax.make_array_from_process_local_data(NamedSharding(mesh, P("p")),
                                              np.ones((1, 256), np.float32))
for step in range(1, 9):
    if jax.process_index() == 1:
        time.sleep(0.1)
    total = add(rows).block_until_ready()
    hvd_magic.report(step=step)
float(np.asarray(total.addressable_data(0)).ravel()[0])
"""


def test_a_jax_cells_timeline_has_every_ranks_psums_merged(ip):
    """--timeline on JAX code: JAX's profiler on every rank over reported steps 3 to 6, the
    ranks' traces merged a process per rank, the jitted psum's XLA op in each, and the verdict
    names the rank that slept."""
    ip.run_cell_magic("horovod", "--np -2 --quiet --timeline-steps 3:6", JAX_LOOP)
    run = hvd_magic.last_run()
    assert run.state == "done" and run.results == [2.0, 2.0], run.error
    assert run.timeline_path.endswith(ranks.FILE_NAME)
    with gzip.open(run.timeline_path, "rt") as f:
        trace = json.load(f)
    assert trace["hvd_magic"]["framework"] == "jax"
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e.get("name") == "process_name"}
    assert sorted(names) == [0, 1] and all(names[r].startswith(f"rank {r} (") for r in names)
    for rank in (0, 1):
        mine = [e for e in trace["traceEvents"] if e.get("pid") == rank]
        steps = [e["name"] for e in mine if e.get("cat") == "hvd_magic.step"]
        assert steps == ["step 3", "step 4", "step 5", "step 6"], steps
        psums = [e for e in mine if e.get("cat") == "jax_collective"]
        assert len(psums) >= 4 and all(e["name"].endswith(":psum") for e in psums), psums
        assert any(e.get("name", "").startswith("PjitFunction") for e in mine)  # JAX's own events
        folder = os.path.join(run.run_dir, "profile", f"rank-{rank}", "plugins", "profile")
        assert [n for _, _, found in os.walk(folder) for n in found
                if n.endswith(".xplane.pb")], folder  # JAX's file, for TensorBoard or XProf
    timeline = ranks.RanksTimeline.load(run.timeline_path)
    assert timeline.verdict().startswith("rank 1 arrived last at "), timeline.verdict()
    html = ip.run_line_magic("horovod_timeline", run.id)
    assert "JAX profile" in getattr(html, "data", str(html))


def test_a_jax_timeline_without_reported_steps_says_what_a_step_is(ip, capsys):
    ip.run_cell_magic("horovod", "--np -2 --timeline", "import jax\n1\n")
    run = hvd_magic.last_run()
    assert run.state == "done" and run.timeline_path is None, run.error
    out = capsys.readouterr().out
    assert "--timeline recorded nothing" in out and "hvd_magic.report(step=...)" in out, out


def test_jax_across_a_standalone_clusters_two_workers(ip, standalone):
    """Four ranks on two workers' executors (127.0.0.1 and 127.0.0.2): the coordinator on task
    0's host, reached from the other's."""
    session = standalone.session()
    try:
        ip.run_cell_magic("horovod", "--np 4 --quiet", JAX_CELL + RESULT)
        run = hvd_magic.last_run()
        assert run.where == standalone.url
        assert len({r.executor for r in run.ranks}) == 2
        assert_jax_world(run.results, n=4)
    finally:
        session.stop()


def test_a_jax_cell_that_runs_its_own_profiler_is_told_why_its_timeline_is_empty(ip, capsys,
                                                                                tmp_path):
    """The cell's own jax.profiler.trace holds JAX's one profiler through the --timeline window:
    the run says the profiler could not start, not that no rank reached the window's steps."""
    cell = (f"import jax, jax.numpy as jnp\nimport hvd_magic\n"
            f"with jax.profiler.trace({str(tmp_path)!r} + '/own' + str(jax.process_index())):\n"
            f"    for step in range(1, 6):\n"
            f"        jnp.ones(4).sum().block_until_ready()\n"
            f"        hvd_magic.report(step=step)\n1\n")
    ip.run_cell_magic("horovod", "--np -2 --timeline-steps 2:3", cell)
    run = hvd_magic.last_run()
    assert run.state == "done" and run.timeline_path is None, run.error
    out = capsys.readouterr().out
    assert "the profiler could not start on rank(s) 0, 1" in out, out
    assert "reached step" not in out, out
