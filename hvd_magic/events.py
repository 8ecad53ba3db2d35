"""The event channel between the ranks' tasks and the driver: its frames, and the task's side.

One `EventServer` per run listens on the driver (`hvd_magic.event_server`). Every task connects
once (`EventClient`), proves it belongs to the run with the run's random token, then sends
length-prefixed JSON frames: lines a rank printed, progress, state changes, result summaries. The
driver may answer on the same connection (a ``stop`` request when the run is cancelled or another
rank failed). Frames are JSON objects, nothing else: nothing that arrives is ever unpickled.

Not for: rank results. Those come back through Spark's own task results (or the local launcher's
files), so this channel can stay free of pickle.
"""

import json
import socket
import struct
import threading

MAX_FRAME = 4 * 1024 * 1024
HEADER = struct.Struct("!I")


def encode_frame(obj):
    data = json.dumps(obj, separators=(",", ":")).encode("utf-8")
    return HEADER.pack(len(data)) + data


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
    (size,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if size > max_frame:
        raise ValueError(f"frame of {size} bytes is over the {max_frame} byte cap")
    obj = json.loads(_recv_exact(sock, size).decode("utf-8"))
    if not isinstance(obj, dict):
        raise ValueError("a frame must be a JSON object")
    return obj


def no_delay(sock):
    """Frames are small and answered: without this, Nagle's algorithm holds a frame back until
    the previous one is acknowledged, and delayed ACKs make that 40 ms on Linux."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class EventClient:
    """Task side: one authenticated connection to the driver; thread-safe `send`."""

    def __init__(self, address, token, on_message=None, timeout=30.0):
        host, port = address.rsplit(":", 1)
        self._sock = socket.create_connection((host, int(port)), timeout=timeout)
        self._sock.settimeout(None)
        no_delay(self._sock)
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
