"""The driver's end of the event channel (`hvd_magic.events`): one `EventServer` per run.

What it guarantees, because the port is reachable from the network:
- the driver never unpickles anything that arrives here: frames are JSON objects, nothing else;
- the token is compared in constant time (`hmac.compare_digest`);
- a frame larger than `MAX_FRAME` bytes, bytes that are not JSON, or a wrong token close that
  connection and are counted in `EventServer.rejected`; they never raise into the run or block it.

The driver's memory stays bounded however fast ranks send: the run's events wait in an
`EventQueue` bounded by the bytes of their frames, and the reading thread waits while it is full,
so a burst the driver applies slower than it arrives waits in the ranks' sockets (TCP holds their
senders back), as bytes, not here as decoded objects (~7 times larger).
"""

import collections
import hmac
import json
import queue
import secrets
import selectors
import socket
import threading
import time

from .events import HEADER, MAX_FRAME, encode_frame, no_delay

_HELLO_TIMEOUT = 10.0
_RECV_BYTES = 256 * 1024   # read at most this much of one connection at a time
MAX_BACKLOG = 4 * 1024 * 1024  # bytes of frames read, not yet taken by the driver (`EventQueue`)


class EventQueue:
    """The run's events in the order they were read, at most `max_bytes` of frames held.

    `put` with the frame's size (the server's reading thread, the only one that does) waits
    while there is no room, until half of it is free (a wake per half a queue, not per event);
    an event bigger than the bound goes into an empty queue. Events made on the driver (size 0:
    a connection dropped, a ring formed) never wait, nor does anything once `close` was called:
    a run that ended takes no more, and its reader must not wait for it.
    The `queue.Queue` methods the driver uses: `get`, `get_nowait`, `qsize`, `empty`.
    """

    def __init__(self, max_bytes=MAX_BACKLOG):
        self.max_bytes = max_bytes
        self.held = 0            # bytes of the frames in the queue
        self.waited = 0.0        # seconds `put` waited for room, in all
        self._items = collections.deque()   # (event, frame bytes)
        self._closed = False
        self._lock = threading.Lock()
        self._taken = threading.Condition(self._lock)
        self._added = threading.Condition(self._lock)

    def put(self, event, size=0):
        with self._lock:
            if size and self.held + size > self.max_bytes and not self._closed:
                started = time.monotonic()
                while self.held and self.held + size > self.max_bytes // 2 and not self._closed:
                    self._taken.wait()
                self.waited += time.monotonic() - started
            self._items.append((event, size))
            self.held += size
            self._added.notify()

    def get(self, block=True, timeout=None):
        with self._lock:
            if not self._added.wait_for(lambda: self._items, timeout if block else 0):
                raise queue.Empty
            event, size = self._items.popleft()
            self.held -= size
            if self.held <= self.max_bytes // 2:
                self._taken.notify()
            return event

    def get_nowait(self):
        return self.get(block=False)

    def qsize(self):
        return len(self._items)

    def empty(self):
        return not self._items

    def close(self):
        """Never wait for room again (the reader goes on, or ends, at once)."""
        with self._lock:
            self._closed = True
            self._taken.notify_all()


class _Peer:
    """One task's connection, as the server's reading thread sees it."""

    __slots__ = ("sock", "buffer", "authenticated", "deadline", "rank")

    def __init__(self, sock, now):
        self.sock = sock
        self.rank = None          # the rank its events are labelled with (`report_drops`)
        self.buffer = bytearray()
        self.authenticated = False
        self.deadline = now + _HELLO_TIMEOUT  # for its hello (the reader's clock: `_now`)


class EventServer:
    """Driver side: accepts task connections, puts their events on `self.events` (an
    `EventQueue`, bounded: its reader waits for room; or any `sink` with a thread-safe `put`,
    which then sees each event as it is read, unbounded: a warm session routes it on at once).

    One thread reads every connection (`selectors`): a thread per connection was most of the
    driver's cost at hundreds of ranks (each small frame woke a thread that then waited for the
    GIL, two system calls per frame), and its latency. Sockets stay blocking: a readable socket
    is read once (up to 256 KiB: many frames), and `announce`/`broadcast` send from other threads
    as before.
    """

    def __init__(self, host="127.0.0.1", max_frame=MAX_FRAME, sink=None, report_drops=False,
                 max_backlog=None):
        self.token = secrets.token_hex(16)
        # a connection that ends puts {"t": "dropped", "rank": r} on `events` (an elastic run's
        # slots: a task whose executor was lost says nothing more)
        self.report_drops = report_drops
        self._backlog = EventQueue(max_backlog or MAX_BACKLOG) if sink is None else None
        self.events = self._backlog if sink is None else sink
        self.max_frame = max_frame
        self.rejected = 0
        self._lock = threading.Lock()
        self._all_read = threading.Condition(self._lock)   # notified as connections end
        self._peers = set()      # authenticated sockets (what announce/broadcast send to)
        self._open = {}          # socket -> _Peer, every connection not yet closed
        self._closed = False
        self._announced = []     # messages for every task, also those that connect later
        self._sock = socket.create_server((host, 0), backlog=1024)
        self.host = host
        self.port = self._sock.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._loop, name="hvd-magic-events", daemon=True)
        self._thread.start()

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def _now(self):
        """The reader's clock: time spent waiting for room in the queue does not count, so a
        hello that came meanwhile is not late."""
        return time.monotonic() - (self._backlog.waited if self._backlog is not None else 0.0)

    def _loop(self):
        try:
            while not self._closed:
                for key, _ in self._selector.select(timeout=0.5):
                    if self._closed:  # (woken from a wait for room by `close`)
                        return
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        return
                    else:
                        self._read(key.data)
                self._expire_hellos()
        finally:
            for peer in list(self._open.values()):
                self._drop(peer)
            self._selector.close()

    def _accept(self):
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        no_delay(conn)
        peer = _Peer(conn, self._now())
        with self._lock:
            self._open[conn] = peer
        self._selector.register(conn, selectors.EVENT_READ, peer)

    def _expire_hellos(self):
        now = self._now()
        for peer in [p for p in self._open.values() if not p.authenticated and p.deadline < now]:
            self._reject()
            self._drop(peer)

    def _drop(self, peer):
        try:
            self._selector.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        with self._lock:
            self._peers.discard(peer.sock)
            self._open.pop(peer.sock, None)
            self._all_read.notify_all()
        peer.sock.close()
        if self.report_drops and peer.rank is not None and not self._closed:
            self.events.put({"t": "dropped", "rank": peer.rank})

    def _reject(self):
        with self._lock:
            self.rejected += 1

    def _read(self, peer):
        try:
            data = peer.sock.recv(_RECV_BYTES)
        except OSError:
            data = b""
        if not data:  # the task closed its side: a hello never sent is a refusal
            if not peer.authenticated:
                self._reject()
            return self._drop(peer)
        # Parsed from the bytes received (plus an earlier partial frame); only the new partial
        # frame is kept: a buffer kept per connection would hold its largest burst (a MiB each,
        # a GiB at 1024 ranks).
        buffer, offset = (bytes(peer.buffer) + data if peer.buffer else data), 0
        try:
            while len(buffer) - offset >= HEADER.size:
                (size,) = HEADER.unpack_from(buffer, offset)
                if size > (self.max_frame if peer.authenticated else 1024):
                    raise ValueError(f"frame of {size} bytes is over the cap")
                end = offset + HEADER.size + size
                if len(buffer) < end:
                    break
                obj = json.loads(buffer[offset + HEADER.size:end].decode("utf-8"))
                offset = end
                if not isinstance(obj, dict):
                    raise ValueError("a frame must be a JSON object")
                if peer.authenticated:
                    peer.rank = obj.get("rank", peer.rank)
                    if self._backlog is not None:
                        self._backlog.put(obj, size)  # waits while the queue is full
                    else:
                        self.events.put(obj)
                else:
                    self._hello(peer, obj)
        # not JSON, absurdly deep, or nonsense a sink could not take (a warm session's routing of
        # an event without its fields): that connection is closed, as its own thread ended
        # before; the thread that reads every other connection goes on
        except (ValueError, UnicodeDecodeError, RecursionError, KeyError, TypeError,
                AttributeError):
            self._reject()
            return self._drop(peer)
        peer.buffer = bytearray(buffer[offset:])

    def _hello(self, peer, hello):
        token = hello.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(),
                                                                 self.token.encode()):
            raise ValueError("bad token")
        with self._lock:
            peer.authenticated = True
            self._peers.add(peer.sock)
            for message in self._announced:  # what every task must hear, however late
                try:
                    peer.sock.sendall(encode_frame(message))
                except OSError:
                    pass

    def announce(self, message):
        """Send a message to every task, connected now or later."""
        with self._lock:  # a task joining meanwhile hears it exactly once
            self._announced.append(message)
            self._send_all(encode_frame(message))

    def stop_all(self, reason):
        """Tell every task, connected now or later, to stop its rank."""
        self.announce({"t": "stop", "reason": reason})

    def broadcast(self, obj):
        """Send a message to every connected task (best effort: a dead peer is skipped)."""
        with self._lock:  # one sender at a time, so frames never interleave on a connection
            self._send_all(encode_frame(obj))

    def _send_all(self, frame):
        for conn in list(self._peers):
            try:
                conn.sendall(frame)
            except OSError:
                pass

    def wait_read(self, timeout):
        """Wait (at most `timeout` s) until every connection has been read to its end: a task
        closes its own once its rank ended, so its last events are in `events` after this. True
        if so, False if `timeout` passed first. The reader waits for room in `events`: whoever
        waits for more than a queue's worth takes them meanwhile (the driver loop calls this with
        timeout 0 between takes)."""
        with self._lock:
            return self._all_read.wait_for(lambda: not self._open or self._closed, timeout)

    def close(self):
        with self._lock:
            self._closed = True
            self._all_read.notify_all()
            peers = list(self._peers)
        if self._backlog is not None:
            self._backlog.close()  # a reader waiting for room ends now; the queue keeps its events
        for conn in peers:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self._wake_w.send(b"x")  # wakes the reading thread, which closes every connection
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._sock.close()
        self._wake_r.close()
        self._wake_w.close()
