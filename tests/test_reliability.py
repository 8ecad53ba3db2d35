"""Re-initialising Horovod never aborts or hangs; a rank that never reaches hvd.init() is named;
logs are on disk while a cell runs.

The rendezvous tests drive the server's HTTP requests in the order that loses with Horovod's own
handler (its DELETE clears the finished lists of every scope when any one completes), the way
Horovod's C++ `HTTPStore` sends them: PUT /scope/rank, GET /scope/peer, DELETE /scope/rank after
the scope's barrier.
"""

import http.client
import json
import os
import subprocess
import sys
import time

import pytest

import hvd_magic
from hvd_magic.frameworks.horovod_rendezvous import Rendezvous
from hvd_magic.timelines import trace


class Store:
    """Requests to a rendezvous server as Horovod's HTTPStore sends them."""

    def __init__(self, port):
        self.port = port

    def _request(self, method, path, body=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request(method, path, body=body)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def put(self, scope, key, value):
        assert self._request("PUT", f"/{scope}/{key}", value)[0] == 200

    def get(self, scope, key):
        status, body = self._request("GET", f"/{scope}/{key}")
        return body if status == 200 else None

    def delete(self, scope, key):
        assert self._request("DELETE", f"/{scope}/{key}")[0] == 200

    def connect(self, scope, ranks, generation):
        """Every rank of `ranks` puts its address and reads the others' (no DELETE yet)."""
        for r in ranks:
            self.put(scope, r, f"{scope}-{r}-gen{generation}".encode())
        for r in ranks:
            for peer in ranks:
                assert self.get(scope, peer) == f"{scope}-{peer}-gen{generation}".encode()


def horovods_server():
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer
    server = RendezvousServer()
    port = server.start()
    server.init(get_host_assignments(parse_hosts("host:2"), 2))
    return server, port


def first_init_with_a_late_global_delete(store):
    """Two ranks on one host, one hvd.init(): rank 1's DELETE of "global" arrives last."""
    store.connect("global", [0, 1], 0)
    store.delete("global", 0)
    store.connect("local_host", [0, 1], 0)
    store.delete("local_host", 0)
    store.delete("local_host", 1)      # local_host completes (Horovod: every finished list cleared)
    store.delete("global", 1)          # ...so global never completes there
    for r in (0, 1):
        store.connect(f"cross_{r}", [0], 0)
        store.delete(f"cross_{r}", 0)


@pytest.fixture
def ours():
    server = Rendezvous("127.0.0.1")
    yield Store(server.port)
    server.stop()


def test_an_idle_rendezvous_sleeps_and_stops_at_once():
    """Its thread lives as long as the run, beside ranks that need every core: it wakes for a
    connection, not to poll; its stop is still immediate, and it answered until then."""
    server = Rendezvous("127.0.0.1")
    store = Store(server.port)
    store.put("global", 0, b"address")

    def wakeups():
        with open(f"/proc/self/task/{server.thread.native_id}/status") as f:
            return sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)
    before = wakeups()
    time.sleep(1.0)
    assert wakeups() - before <= 2  # (it polled 20 times a second)
    assert store.get("global", 0) == b"address"
    start = time.monotonic()
    server.stop()
    assert time.monotonic() - start < 1.0 and not server.thread.is_alive()


def test_the_next_init_never_reads_a_peers_stale_address(ours):
    first_init_with_a_late_global_delete(ours)
    ours.put("global", 0, b"global-0-gen1")     # rank 0 is in its second hvd.init()
    assert ours.get("global", 1) is None        # rank 1 is not: nothing to connect to yet
    ours.put("global", 1, b"global-1-gen1")
    assert ours.get("global", 1) == b"global-1-gen1"
    assert ours.get("global", 0) == b"global-0-gen1"


def test_horovods_own_handler_serves_the_stale_address():
    # The same requests against Horovod's handler: what the test above guards against.
    server, port = horovods_server()
    try:
        store = Store(port)
        first_init_with_a_late_global_delete(store)
        store.put("global", 0, b"global-0-gen1")
        assert store.get("global", 1) == b"global-1-gen0"   # a dead address: Connection refused
    finally:
        server.stop()


def late_delete_after_a_fresh_put(store):
    store.connect("global", [0, 1], 0)
    store.delete("global", 0)
    store.put("global", 0, b"global-0-gen1")   # rank 0 already in its next hvd.init()
    store.delete("global", 1)                  # rank 1's DELETE of the first one arrives now
    return store.get("global", 0)


def test_a_late_delete_never_wipes_a_fresh_address(ours):
    assert late_delete_after_a_fresh_put(ours) == b"global-0-gen1"


def test_horovods_own_handler_wipes_the_fresh_address():
    server, port = horovods_server()
    try:
        # rank 1 would wait for rank 0's key until Gloo's timeout: the hang in connectFullMesh
        assert late_delete_after_a_fresh_put(Store(port)) is None
    finally:
        server.stop()


def test_every_generation_reads_only_its_own_addresses(ours):
    for generation in range(50):
        for scope in ("global", "local_host"):
            ours.connect(scope, [0, 1, 2], generation)
            for r in (2, 0, 1):
                ours.delete(scope, r)
    assert ours.get("global", 0) is None


# --- hvd.init() and hvd.shutdown() in a loop, beside processes that want the CPU -------------

INIT_CYCLES = """\
import torch, horovod.torch as hvd
for cycle in range({cycles}):
    hvd.init()
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, name=f"cycle{{cycle}}").item()
    assert total == hvd.size(), total
    hvd.shutdown()
cycle + 1
"""


@pytest.fixture
def busy_cpus():
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


@pytest.mark.parametrize("np", [-2, 2], ids=["driver-only", "spark"])
def test_init_shutdown_cycles_under_load(ip, np, busy_cpus):
    cycles = 40
    value = ip.run_cell_magic("horovod", f"--np {np} --quiet --timeout 600",
                              INIT_CYCLES.format(cycles=cycles))
    assert value == cycles
    assert hvd_magic.last_run().results == [cycles, cycles]


# --- a rank that never reaches hvd.init() -----------------------------------------------------

def test_a_rank_missing_from_init_is_named_within_the_stall_timeout(ip):
    cell = ("import os, time, horovod.torch as hvd\n"
            "if os.environ['HOROVOD_RANK'] != '1':\n"
            "    hvd.init()\n"
            "else:\n"
            "    print('loading the data first')\n"
            "    time.sleep(300)\n")
    # Gloo alone would give up only after minutes; --timeout is the net should the watchdog miss.
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -3 --stall-timeout 4 --on-stall fail --timeout 120 "
                                     "--quiet", cell)
    text = str(info.value)
    assert "ranks 0, 2 have been waiting in hvd.init()" in text
    assert "for rank 1, which has not called it" in text
    assert "rank 1: last line: loading the data first" in text, text
    run = hvd_magic.last_run()
    assert run.stop_reason == "stalled"
    # what each rank was doing: the missing one in its sleep, the others in hvd.init()
    assert "rank 1: Cell In[" in text and "ranks 0, 2: Cell In[" in text, text
    assert os.path.exists(os.path.join(run.run_dir, "stacks.txt"))


# --- logs reach the disk while the cell runs ---------------------------------------------------

def test_a_ranks_log_is_on_disk_while_the_cell_runs(ip):
    cell = ("import time\n"
            "for i in range(3):\n"
            "    print('line', i, flush=True)\n"
            "time.sleep(30)\n")
    run = ip.run_cell_magic("horovod", "--np -2 --background --quiet", cell)
    try:
        deadline = time.monotonic() + 60
        text = ""
        while "line 2" not in text and time.monotonic() < deadline:
            time.sleep(0.2)
            with open(run.log_path(1)) as f:
                text = f.read()
        assert run.state == "running"
        assert text.splitlines() == ["line 0", "line 1", "line 2"]
    finally:
        run.cancel()
        with pytest.raises(hvd_magic.RunCancelled):
            run.wait(60)


def test_a_running_runs_folder_already_tells_its_story(ip):
    """What a notebook killed now would leave: events, rank states and the timeline so far."""
    cell = ("import time, torch, horovod.torch as hvd\n"
            "import hvd_magic\n"
            "hvd.init()\n"
            "for step in range(600):\n"
            "    hvd.allreduce(torch.ones(4), name='streamed')\n"
            "    hvd_magic.report(step=step, total=600, loss=1.0 / (step + 1))\n"
            "    time.sleep(0.05)\n")
    run = ip.run_cell_magic("horovod", "--np -2 --timeline --background --quiet", cell)
    try:
        def folder():
            with open(os.path.join(run.run_dir, "events.jsonl")) as f:
                events = [json.loads(line) for line in f]
            with open(os.path.join(run.run_dir, "run.json")) as f:
                meta = json.load(f)
            partial = os.path.join(run.run_dir, "timeline.json.part")
            timeline = open(partial).read() if os.path.exists(partial) else ""
            return events, meta, timeline

        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            events, meta, timeline = folder()
            if "streamed" in timeline and all(r["step"] for r in meta["ranks"]):
                break
            time.sleep(0.5)
        assert run.state == "running"
        assert {e["rank"] for e in events if e["t"] == "state" and e["state"] == "starting"} == {0, 1}
        assert any(e["t"] == "progress" and e["metrics"]["loss"] < 1 for e in events)
        assert [r["state"] for r in meta["ranks"]] == ["running", "running"]
        events = trace.repair(timeline)  # cut off mid-run, and still readable
        assert any(e.get("ph") == "M" and e["args"].get("name") == "allreduce.streamed" for e in events)
    finally:
        run.cancel()
        with pytest.raises(hvd_magic.RunCancelled):
            run.wait(60)
    assert os.path.exists(run.timeline_path) and not os.path.exists(run.timeline_path + ".part")
