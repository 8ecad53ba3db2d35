"""The event channel between the ranks' tasks and the driver.

One `EventServer` per run listens on the driver. Every task connects once, proves it belongs to
the run with the run's random token, then sends length-prefixed JSON frames: lines a rank printed,
progress, state changes, result summaries. The driver may answer on the same connection (a
``stop`` request when the run is cancelled or another rank failed).

What this module guarantees, because the port is reachable from the network:
- the driver never unpickles anything that arrives here: frames are JSON objects, nothing else;
- the token is compared in constant time (`hmac.compare_digest`);
- a frame larger than `MAX_FRAME` bytes, bytes that are not JSON, or a wrong token close that
  connection and are counted in `EventServer.rejected`; they never raise into the run or block it.

Not for: rank results. Those come back through Spark's own task results (or the local launcher's
files), so this channel can stay free of pickle.
"""

import hmac
import json
import queue
import secrets
import socket
import struct
import threading
import time

MAX_FRAME = 4 * 1024 * 1024
_HEADER = struct.Struct("!I")
_HELLO_TIMEOUT = 10.0


def encode_frame(obj):
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    return _HEADER.pack(len(data)) + data


def _recv_exact(sock, n):
    chunks = []
    while n:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(sock, max_frame=MAX_FRAME):
    """Read one frame; raise ValueError for an oversized or malformed one, EOFError at the end."""
    (size,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if size > max_frame:
        raise ValueError(f"frame of {size} bytes is over the {max_frame} byte cap")
    obj = json.loads(_recv_exact(sock, size).decode("utf-8"))
    if not isinstance(obj, dict):
        raise ValueError("a frame must be a JSON object")
    return obj


def read_frame_from(stream, max_frame=MAX_FRAME):
    """`read_frame` from a buffered reader of the socket: one ``recv`` brings many small frames
    (at hundreds of ranks, two system calls per frame were most of the event server's cost)."""
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(header)
    if size > max_frame:
        raise ValueError(f"frame of {size} bytes is over the {max_frame} byte cap")
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    obj = json.loads(data.decode("utf-8"))
    if not isinstance(obj, dict):
        raise ValueError("a frame must be a JSON object")
    return obj


def _no_delay(sock):
    """Frames are small and answered: without this, Nagle's algorithm holds a frame back until
    the previous one is acknowledged, and delayed ACKs make that 40 ms on Linux."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class EventServer:
    """Driver side: accepts task connections, puts their events on `self.events` (a Queue, or
    any `sink` with a thread-safe `put`, which then sees each event as it is read)."""

    def __init__(self, host="127.0.0.1", max_frame=MAX_FRAME, sink=None):
        self.token = secrets.token_hex(16)
        self.events = queue.Queue() if sink is None else sink
        self.max_frame = max_frame
        self.rejected = 0
        self._lock = threading.Lock()
        self._peers = set()
        self._closed = False
        self._announced = []     # messages for every task, also those that connect later
        self._sock = socket.create_server((host, 0), backlog=128)
        self.host = host
        self.port = self._sock.getsockname()[1]
        self._threads = []
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name="hvd-magic-events", daemon=True)
        self._accept_thread.start()

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def _accept_loop(self):
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            _no_delay(conn)
            t = threading.Thread(target=self._serve, args=(conn,),
                                 name="hvd-magic-events-conn", daemon=True)
            t.start()
            with self._lock:
                self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _reject(self):
        with self._lock:
            self.rejected += 1

    def _serve(self, conn):
        stream = None
        try:
            conn.settimeout(_HELLO_TIMEOUT)
            try:
                hello = read_frame(conn, max_frame=1024)
                token = hello.get("token")
                if not isinstance(token, str) or not hmac.compare_digest(
                        token.encode(), self.token.encode()):
                    raise ValueError("bad token")
            except (ValueError, EOFError, OSError, UnicodeDecodeError, RecursionError, struct.error):
                self._reject()
                return
            conn.settimeout(None)
            with self._lock:
                if self._closed:
                    return
                self._peers.add(conn)
                for message in self._announced:  # what every task must hear, however late
                    conn.sendall(encode_frame(message))
            stream = conn.makefile("rb", buffering=256 * 1024)
            while True:
                try:
                    event = read_frame_from(stream, self.max_frame)
                except EOFError:
                    return
                except (ValueError, UnicodeDecodeError, RecursionError):  # not JSON, or absurdly deep
                    self._reject()
                    return
                except OSError:
                    return
                self.events.put(event)
        finally:
            with self._lock:
                self._peers.discard(conn)
            if stream is not None:  # (the socket stays open while its reader is)
                stream.close()
            conn.close()

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
        closes its own once its rank ended, so its last events are in `events` after this."""
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))

    def close(self):
        with self._lock:
            self._closed = True
            peers = list(self._peers)
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        except OSError:
            pass
        self._sock.close()
        for conn in peers:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._accept_thread.join(timeout=5)
        for t in list(self._threads):
            t.join(timeout=5)


class EventClient:
    """Task side: one authenticated connection to the driver; thread-safe `send`."""

    def __init__(self, address, token, on_message=None, timeout=30.0):
        host, port = address.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._sock.settimeout(None)
        _no_delay(self._sock)
        self._lock = threading.Lock()
        self._sock.sendall(encode_frame({"token": token}))
        self._reader = None
        if on_message is not None:
            self.start_reading(on_message)

    def start_reading(self, on_message):
        """Hand every message from the driver to `on_message`, in a thread of its own."""
        self._reader = threading.Thread(
            target=self._read_loop, args=(on_message,), name="hvd-magic-client", daemon=True)
        self._reader.start()

    def _read_loop(self, on_message):
        while True:
            try:
                msg = read_frame(self._sock)
            except (EOFError, OSError, ValueError):
                on_message({"t": "closed"})  # the driver went away (or we closed)
                return
            on_message(msg)

    def send(self, event):
        frame = encode_frame(event)
        with self._lock:
            self._sock.sendall(frame)

    def close(self):
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if self._reader is not None:
            self._reader.join(timeout=5)
        self._sock.close()
