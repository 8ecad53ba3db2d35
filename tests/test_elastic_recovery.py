"""What an elastic run's recovery touches, and how long it waits: a loss cuts only the sockets
the group made (the code's own connection to a server, opened before the loss, still works
after it, on both elastic kinds); a member alive but frozen (a real SIGSTOP) is given up after
``--frozen-timeout`` and the others go on; the driver's word on the members is heard while a
stack snapshot is slow; a rank's own socket error is its error, not a bystander's. Real rank
processes, real Gloo, real Horovod, real sockets and signals."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from hvd_magic.driver import frozen
from hvd_magic.driver.ranks import RankState
from hvd_magic.errors import is_follow_on

from conftest import ROOT, cancelled_if_running
from test_elastic import ELASTIC_CELL as HOROVOD_CELL
from test_elastic_ddp import CELL as DDP_CELL, _elastic_run as _ddp_run, _kill_at_step

# -- the code's own connection survives a loss ----------------------------------------------------


ECHO_SERVER = """\
import socketserver
class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        for line in self.rfile:
            self.wfile.write(line)
server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.fixture
def echo_server():
    """A server of the code's own (as an MLflow tracking server or a database is), in a process
    of its own on 127.0.0.1, where every rank of the run is too: its port."""
    server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdout=subprocess.PIPE)
    try:
        yield int(server.stdout.readline())
    finally:
        server.kill()
        server.wait()
        server.stdout.close()


# The connection opens once the group is made (before the loss) and is used at every step and
# at the end: a cut one raises BrokenPipeError or reads nothing. `group`: how many sockets the
# rank knows as its group's at the end (none: a loss would cut nothing, and a survivor would
# wait on a peer that left its group).
OWN_SOCKET = """\
import os, socket
from hvd_magic.rank import elastic_world
own = socket.create_connection(("127.0.0.1", port))

def echoed(word):
    own.sendall(word + b"\\n")
    return own.makefile("rb").readline().strip() == word
"""


def _with_own_socket(cell, made, result):
    """`cell` with the connection opened after its line `made`, used at each reported step and
    at the end (``own`` in its value, a dict that begins with `result`)."""
    report = "        hvd_magic.report(step=state.step, total=steps)\n"
    for old, new in ((made, made + OWN_SOCKET),
                     (report, "        assert echoed(b'step')\n" + report),
                     (result, '{"own": echoed(b"after"), '
                              '"group": len(elastic_world.world().sockets.current()), '
                              + result[1:])):
        assert cell.count(old) == 1, old
        cell = cell.replace(old, new)
    return cell


def test_a_ddp_loss_leaves_the_codes_own_connection_open(ip, fresh_ns, echo_server):
    fresh_ns.update(steps=60, grow_to=3, raise_at=None, port=echo_server)
    cell = _with_own_socket(DDP_CELL, 'dist.init_process_group("gloo")\n', '{"weights": ')
    with _ddp_run(ip, "--np -3 --min-np 2", cell) as run:
        _kill_at_step(run, 2, 20)
        results = run.wait(240)

    assert run.state == "done", run.error  # (a cut connection: BrokenPipeError, the run's)
    assert [c["rank"] for c in run.membership if c["t"] == "lost"] == [2], run.membership
    assert 2 in results[0]["worlds"]  # slots 0 and 1 trained on, in a world without slot 2
    assert len(results) == 3 and all(r["own"] and r["group"] for r in results), results


def test_a_horovod_loss_leaves_the_codes_own_connection_open(ip, fresh_ns, echo_server):
    pytest.importorskip("horovod.torch")
    fresh_ns.update(steps=80, commit_every=10, grow_to=1, port=echo_server)
    cell = _with_own_socket(HOROVOD_CELL, "hvd.init()\n", '{"step": ')
    run = ip.run_cell_magic("horovod", "--np -3 --min-np 2 --background --quiet --env "
                                       "HOROVOD_GLOO_TIMEOUT_SECONDS=10", cell)
    with cancelled_if_running(run):
        _kill_at_step(run, 1, 25)
        results = run.wait(240)

    assert run.state == "done", run.error  # (a cut connection: BrokenPipeError, the run's)
    lost = {c["rank"] for c in run.membership if c["t"] == "lost"}
    assert 1 in lost and len(lost) < 3, run.membership  # (one never lost: its own connection)
    assert results and all(r["own"] and r["group"] for r in results), results


# -- a frozen member is given up ------------------------------------------------------------------


def _stop_at_step(run, slot, step):
    """SIGSTOP slot `slot`'s rank process once it reported `step`: alive, its sockets open,
    never answering. Its pid."""
    victim = run.ranks[slot]
    deadline = time.monotonic() + 120
    while (victim.step or 0) < step:
        assert run.state == "running" and time.monotonic() < deadline, run.error
        time.sleep(0.02)
    os.kill(victim.pid, signal.SIGSTOP)
    return victim.pid


def _given_up(run, slot, pid):
    """The membership says slot `slot` (`pid`) was given up as frozen, first of all losses."""
    lost = [c for c in run.membership if c["t"] == "lost"]
    assert lost and (lost[0]["rank"], lost[0]["pid"], lost[0]["code"]) == \
        (slot, pid, -signal.SIGKILL), run.membership
    how = lost[0]["how"]
    assert "frozen" in how and "4 s (--frozen-timeout)" in how and "waited" in how, how
    return lost


def test_a_frozen_ddp_member_is_given_up_after_the_frozen_timeout(ip, fresh_ns):
    """Slot 2 SIGSTOPped mid-training. The others wait in backward; after --frozen-timeout 4
    its task kills it, the survivors go on without it, a replacement joins, and the run ends
    with every rank's result (without it the survivors wait for the run's --timeout)."""
    fresh_ns.update(steps=60, grow_to=3, raise_at=None)
    with _ddp_run(ip, "--np -3 --min-np 2 --frozen-timeout 4 --timeout 200") as run:
        pid = _stop_at_step(run, 2, 20)
        results = run.wait(200)

    assert run.state == "done", run.error
    lost = _given_up(run, 2, pid)
    assert len(lost) == 1 and "ranks 0, 1 waited" in lost[0]["how"], run.membership
    assert len(results) == 3 and 2 in results[0]["worlds"], results


def test_a_frozen_horovod_member_is_given_up_after_the_frozen_timeout(ip, fresh_ns):
    pytest.importorskip("horovod.torch")
    fresh_ns.update(steps=80, commit_every=10, grow_to=1)
    run = ip.run_cell_magic("horovod", "--np -3 --min-np 2 --frozen-timeout 4 --timeout 200 "
                                       "--background --quiet", HOROVOD_CELL)
    with cancelled_if_running(run):
        pid = _stop_at_step(run, 1, 25)
        results = run.wait(200)

    assert run.state == "done", run.error
    _given_up(run, 1, pid)
    assert results and all(r["step"] == 80 for r in results), results


def test_a_member_stopped_before_its_group_is_given_up_and_the_others_go_on(ip, fresh_ns):
    """Slot 2 stops itself (SIGSTOP) before its init_process_group, its replacement too:
    slots 0 and 1 wait for it while the group is made (on the old code unseen, the run waited
    for its --timeout); after --frozen-timeout 4 it is given up, the two form a world of their
    own and finish."""
    fresh_ns.update(steps=10, grow_to=2, raise_at=None)
    stop = ("import os, signal\nif os.environ['HVD_MAGIC_ELASTIC_SLOT'] == '2':\n"
            "    os.kill(os.getpid(), signal.SIGSTOP)\n")
    with _ddp_run(ip, "--np -3 --min-np 2 --frozen-timeout 4 --timeout 200", stop + DDP_CELL) \
            as run:
        results = run.wait(200)

    assert run.state == "done", run.error
    lost = [c for c in run.membership if c["t"] == "lost"]
    assert (lost[0]["rank"], lost[0]["code"]) == (2, -signal.SIGKILL), run.membership
    assert "(init_process_group) that ranks 0, 1 waited in" in lost[0]["how"], lost[0]["how"]
    assert len(results) == 2 and all(r["worlds"] == [2] * 10 for r in results), results


def test_left_behind_means_every_member_still_alive_idle_after_one_ended():
    wall = 5000.0
    done, stopped, busy = _rank(0), _rank(1), _rank(2)
    done.exit = 0
    for r, cpu in ((stopped, 0.0), (busy, 97.0)):
        _sampled(r, cpu, wall)
    assert frozen.left_behind([done, stopped], 8, wall) == [stopped]
    # one still at work: the run is not waiting on the idle one alone
    assert frozen.left_behind([done, stopped, busy], 8, wall) == []
    # nobody ended yet: an idle member is the collective check's to judge
    assert frozen.left_behind([stopped], 8, wall) == []
    assert frozen.left_behind([done, stopped], 30, wall) == []  # sampled 10 s of the 30
    assert "every other member had ended" in frozen.how([], 8)


def _rank(rank, blocked_for=None, now=1000.0):
    r = RankState(rank)
    r.pid = 100 + rank
    if blocked_for is not None:
        r.blocked_since, r.blocked_op = now - blocked_for, "backward"
    return r


def _sampled(r, cpu, wall, seconds=10):
    for t in range(seconds + 1):
        r.usage.add({"t": "resources", "time": wall - seconds + t, "cpu": cpu, "rss": 1})


def test_frozen_means_idle_while_others_waited_that_long():
    wall = 5000.0
    waiting, busy, stopped = _rank(0, 9), _rank(1), _rank(2)
    for r, cpu in ((waiting, 0.0), (busy, 97.0), (stopped, 0.0)):
        _sampled(r, cpu, wall)
    ranks = [waiting, busy, stopped]
    assert frozen.frozen(ranks, 8, {}, now=1000.0, wall=wall) == ([waiting], [stopped])
    # nobody waited that long yet: nobody is given up
    assert frozen.frozen(ranks, 10, {}, now=1000.0, wall=wall) == ([], [])
    # a rank whose own wait ended a moment ago (its word came before its peer's) is idle too
    assert frozen.frozen(ranks, 8, {2: 999.0}, now=1000.0, wall=wall) == ([waiting], [])
    # a rank not sampled for the whole time is not known to be idle
    fresh = _rank(3)
    _sampled(fresh, 0.0, wall, seconds=2)
    assert frozen.frozen([waiting, fresh], 8, {}, now=1000.0, wall=wall) == ([waiting], [])
    assert "ranks 0, 1 waited" in frozen.how([_rank(0, 9), _rank(1, 9)], 8)


# -- the group's sockets alone --------------------------------------------------------------------


def test_only_the_sockets_a_group_made_are_cut(echo_server):
    from hvd_magic.rank.sockets import GroupSockets

    own = socket.create_connection(("127.0.0.1", echo_server))
    group = GroupSockets()
    with group.making():
        made = socket.create_connection(("127.0.0.1", echo_server))  # (the group's, as Gloo's)
    later = socket.create_connection(("127.0.0.1", echo_server))  # the code's, after the group
    group.cut()
    with pytest.raises(OSError):
        made.sendall(b"x\n")
    for conn in (own, later):
        conn.sendall(b"still\n")
        assert conn.makefile("rb").readline() == b"still\n"
    made.close()
    reused = socket.create_connection(("127.0.0.1", echo_server))  # (may take made's number)
    group.cut()
    reused.sendall(b"mine\n")
    assert reused.makefile("rb").readline() == b"mine\n"


# -- the driver's word is heard while a snapshot is slow ------------------------------------------

SLOW_REPR = """\
import json, os, sys, threading, time
from hvd_magic.rank import elastic_world, reporting, stacks
heard = threading.Event()
elastic_world.heard = lambda line: heard.set()
reporting.send = lambda event: None

class Slow:
    def __repr__(self):
        time.sleep(5)
        return "slow"

def users_frame(value):
    threading.Event().wait()

threading.Thread(target=users_frame, args=(Slow(),), daemon=True).start()
read, write = os.pipe()
os.environ["HVD_MAGIC_PROBE_FD"] = str(read)
stacks.install()
os.write(write, b"request-1\\n")
time.sleep(0.5)  # (the snapshot is under way: it reprs Slow for 5 s)
began = time.monotonic()
os.write(write, json.dumps({"t": "lost", "slot_lost": 2}).encode() + b"\\n")
print(heard.wait(10), round(time.monotonic() - began, 1))
"""


def test_the_drivers_word_is_not_held_behind_a_slow_snapshot(tmp_path):
    script = tmp_path / "slow_repr.py"  # (a file of the user's: its frames' locals are shown)
    script.write_text(SLOW_REPR)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    answered, seconds = done.stdout.split()
    assert answered == "True" and float(seconds) < 3, done.stdout + done.stderr


# -- errors by cause ------------------------------------------------------------------------------


def test_a_ranks_own_socket_error_is_its_own_not_a_bystanders():
    from hvd_magic.rank import stall
    from hvd_magic.rank.__main__ import error_record

    def own_server_gone():
        raise BrokenPipeError(32, "Broken pipe")

    def collective():
        raise RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer")

    try:
        own_server_gone()
    except BrokenPipeError as exc:
        own = error_record(exc)
    try:
        stall._blocking(collective, "all_reduce")()
    except RuntimeError as exc:
        peer = error_record(exc)
        assert stall.from_collective(exc) == "all_reduce"
    assert own["cause"] == "code" and not is_follow_on(own)
    assert "cause" not in peer and is_follow_on(peer)
    # a peer's words without the rank's word on the cause are read as before
    assert is_follow_on({"type": "OSError", "message": "[Errno 32] Broken pipe"})


def test_the_codes_own_socket_error_is_not_taken_for_a_loss():
    """hvd_magic.elastic.run: a BrokenPipeError of the code's own, raised just after the driver
    said a member was lost, ends the run as the code's error; a collective's is the loss."""
    from hvd_magic import elastic
    from hvd_magic.rank import stall

    class LostAMember:  # (the driver's word came: `World.troubled`)
        def troubled(self, timeout):
            return True

    assert not elastic._lost_peer(LostAMember(), BrokenPipeError(32, "Broken pipe"))
    try:
        stall._blocking(lambda: os.write(-1, b""), "all_reduce", hold=False)()
    except OSError as exc:  # (an OSError out of a collective: the loss's)
        assert elastic._lost_peer(LostAMember(), exc)
