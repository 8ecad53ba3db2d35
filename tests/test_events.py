"""The event channel refuses what does not belong to the run, and the run goes on regardless.

Connections are made to the live `EventServer` of a real run while its ranks wait: a wrong token,
an oversized frame, frames that are not JSON objects, and (hypothesis) arbitrary bytes. Each one
is refused, closed and counted in `EventServer.rejected`; the run then completes with the right
values and complete logs.

The server also keeps the driver's memory bounded: with a consumer slower than its senders, its
queue never holds more than its bound of frames, the senders are held back, nothing is lost or
reordered, and `close` lets a reader that waits for room go at once.
"""

import os
import socket
import struct
import threading
import time

from hypothesis import HealthCheck, given, settings, strategies as st

import hvd_magic
from hvd_magic.event_server import EventServer
from hvd_magic.events import MAX_FRAME, EventClient, encode_frame


def send_and_wait_closed(address, data):
    """Send raw bytes to the server, then wait until it has closed the connection."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass  # b"" once the server closed its side: the refusal is counted by then
        except OSError:
            pass  # a reset (it closed with our bytes unread) or already shut: closed all the same


def frame(data):
    return struct.pack("!I", len(data)) + data


def hello(token):
    return encode_frame({"token": token})


def refusals(server):
    """Everything the server must refuse, each as the bytes of one connection."""
    return {
        "wrong token": hello("0" * 32),
        "token of the wrong type": frame(b'{"token": 12345}'),
        "no hello at all": b"",
        "hello over its 1 KiB cap": struct.pack("!I", 1025) + b"{" * 1025,
        "frame over the cap": hello(server.token) + struct.pack("!I", MAX_FRAME + 1),
        "frame that is not JSON": hello(server.token) + frame(b"\x80\x81 not json"),
        "frame that is not an object": hello(server.token) + frame(b"[1, 2, 3]"),
        "cut-off frame": hello(server.token) + struct.pack("!I", 100) + b"{}",
        "frame nested too deep to parse": hello(server.token) + frame(b"[" * 100000 + b"]" * 100000),
    }


def test_server_alone_refuses_bad_peers_and_keeps_serving_good_ones():
    server = EventServer()
    try:
        client = EventClient(server.address, server.token)
        client.send({"t": "lines", "rank": 0, "lines": ["before"]})
        cases = refusals(server)
        for data in cases.values():
            send_and_wait_closed(server.address, data)
        client.send({"t": "lines", "rank": 0, "lines": ["after"]})
        client.close()
        got = [server.events.get(timeout=30)["lines"] for _ in range(2)]
        assert got == [["before"], ["after"]]
        # "cut-off frame" ends in EOF after a good hello: a closed connection, not a refusal.
        assert server.rejected == len(cases) - 1
    finally:
        server.close()


def release(path, timeout=120):
    """Open a FIFO for writing (returns once its rank has opened it for reading), then close."""
    done = threading.Event()

    def open_and_close():
        with open(path, "w") as f:
            f.write("go")
        done.set()

    threading.Thread(target=open_and_close, daemon=True).start()
    assert done.wait(timeout), f"the rank never opened {path}"


def test_live_run_refuses_bad_tokens_big_frames_and_random_bytes(tmp_path):
    def waits_on_fifo(fifo_dir):
        """Each rank blocks on its FIFO until the test is done attacking, then runs an allreduce."""
        import os
        import torch
        import horovod.torch as hvd
        rank = int(os.environ["HOROVOD_RANK"])
        with open(os.path.join(fifo_dir, f"go-{rank}")) as fifo:
            fifo.read()
        hvd.init()
        print(f"rank {rank} past the attack")
        return hvd.allreduce(torch.tensor([rank + 1.0]), op=hvd.Sum).item()

    for rank in range(2):
        os.mkfifo(tmp_path / f"go-{rank}")
    run = hvd_magic.run(waits_on_fifo, np=-2, args=(str(tmp_path),), background=True,
                        run_dir=str(tmp_path / "run"))
    server = run._server
    attacks = 0
    try:
        for data in refusals(server).values():
            send_and_wait_closed(server.address, data)
        attacks = server.rejected
        assert attacks == len(refusals(server)) - 1   # the cut-off frame is a plain EOF

        @settings(max_examples=150, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow])
        @given(st.binary(max_size=2048))
        def random_bytes_are_refused(data):
            nonlocal attacks
            send_and_wait_closed(server.address, data)
            attacks += 1
            assert server.rejected == attacks

        random_bytes_are_refused()
        assert attacks > 100  # hypothesis did send many connections' worth of bytes
        assert run.state == "running"
    finally:
        if run.state == "running":  # (a rank that failed early never opens its FIFO)
            for rank in range(2):
                release(tmp_path / f"go-{rank}")
    # A peer with the token (so, a task of this run) sending nonsense of the right shape: the
    # event is dropped and counted, the run goes on.
    client = EventClient(server.address, server.token)
    client.send({"t": "lines", "rank": 0, "lines": 5})
    client.send({"t": "progress", "rank": 1, "metrics": [1, 2]})
    client.close()
    assert run.wait(timeout=300) == [3.0, 3.0]
    assert run.rejected_events == 1   # (metrics that are not a dict are simply ignored)
    assert run.rejected_frames == attacks
    for rank in range(2):
        with open(run.log_path(rank)) as f:
            assert f.read().splitlines() == [f"rank {rank} past the attack"]



def test_one_reading_thread_takes_hundreds_of_connections_in_order_and_loses_nothing():
    server = EventServer()
    try:
        clients = [EventClient(server.address, server.token) for _ in range(200)]
        for seq in range(20):
            for rank, client in enumerate(clients):
                client.send({"t": "progress", "rank": rank, "seq": seq, "pad": "x" * 300})
            if seq == 10:  # a bad peer among them closes only its own connection
                send_and_wait_closed(server.address, hello(server.token) + frame(b"[1]"))
        for client in clients:
            client.close()
        server.wait_read(timeout=30)
        got = {}
        while not server.events.empty():
            event = server.events.get_nowait()
            got.setdefault(event["rank"], []).append(event["seq"])
        assert got == {rank: list(range(20)) for rank in range(200)}
        assert server.rejected == 1
        assert threading.active_count() < 20  # not a thread per connection
    finally:
        server.close()


def _send_all_in_thread(client, events):
    """Send `events` from a thread (its sends block while the server holds the sender back);
    the thread's outcome: the events sent, and the error that ended it, if any."""
    outcome = {"sent": 0, "error": None}

    def send():
        try:
            for event in events:
                client.send(event)
                outcome["sent"] += 1
        except OSError as exc:  # the server closed the connection
            outcome["error"] = exc

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread, outcome


def test_a_slow_consumer_holds_a_fast_sender_back_and_every_event_arrives_in_order():
    bound = 64 * 1024
    server = EventServer(max_backlog=bound)
    try:
        client = EventClient(server.address, server.token)
        count = 3000  # ~3 MB of frames: 48 times the bound
        thread, outcome = _send_all_in_thread(
            client, ({"t": "lines", "rank": 0, "seq": seq, "pad": "x" * 1000}
                     for seq in range(count)))
        got, largest = [], 0
        while len(got) < count:
            largest = max(largest, server.events.held)
            got.append(server.events.get(timeout=30)["seq"])
            if len(got) % 100 == 0:
                time.sleep(0.01)  # the driver applying events slower than they come
        assert got == list(range(count))  # in order, none lost, none twice
        assert 0 < largest <= bound
        assert server.events.waited > 0  # the reader did wait for room: TCP held the sender
        thread.join(30)
        assert outcome == {"sent": count, "error": None}
        client.close()
        assert server.wait_read(timeout=30)
        assert server.events.empty()
    finally:
        server.close()


def test_close_ends_a_reader_that_waits_for_room_at_once_and_keeps_what_was_read():
    bound = 64 * 1024
    server = EventServer(max_backlog=bound)
    client = EventClient(server.address, server.token)
    frame_bytes = len(encode_frame({"t": "lines", "rank": 0, "seq": 0, "pad": "x" * 1000}))
    thread, outcome = _send_all_in_thread(
        client, ({"t": "lines", "rank": 0, "seq": seq, "pad": "x" * 1000}
                 for seq in range(100_000)))   # far more than the bound and the sockets hold
    deadline = time.monotonic() + 30
    while server.events.held + frame_bytes <= bound:  # nobody takes: the queue fills up
        assert time.monotonic() < deadline, "the queue never filled"
        time.sleep(0.01)
    started = time.monotonic()
    server.close()
    assert time.monotonic() - started < 2
    assert not server._thread.is_alive()
    thread.join(30)
    assert not thread.is_alive() and outcome["error"] is not None  # the sender was let go too
    client.close()
    got = []
    while not server.events.empty():
        got.append(server.events.get_nowait()["seq"])
    assert got == list(range(len(got))) and len(got) * frame_bytes >= bound // 2
    server.events.put({"t": "late"}, 10 * bound)  # a closed queue never waits
    assert server.events.get_nowait() == {"t": "late"}


def test_a_run_whose_ranks_print_faster_than_the_driver_takes_loses_no_line(tmp_path,
                                                                            monkeypatch):
    import hvd_magic.event_server

    monkeypatch.setattr(hvd_magic.event_server, "MAX_BACKLOG", 32 * 1024)

    def prints_a_burst():
        import os
        rank = int(os.environ["HOROVOD_RANK"])
        for i in range(20_000):  # ~1 MB a rank, at once: 30 times the bound
            print(f"rank {rank} line {i:05d} " + "y" * 30)
        return rank

    run = hvd_magic.run(prints_a_burst, np=-2, run_dir=str(tmp_path / "run"))
    assert run.results == [0, 1]
    assert run._server.events.waited > 0  # the bound was reached: the reader waited
    for rank in range(2):
        with open(run.log_path(rank)) as f:
            assert f.read().splitlines() == [f"rank {rank} line {i:05d} " + "y" * 30
                                             for i in range(20_000)]
