"""Horovod's Gloo rendezvous, served by task 0 of a launch: a key-value store over HTTP.

Every ``hvd.init()`` builds Gloo contexts in scopes ("global", "local_<host>", "cross_<i>", and
one more of each per process set). In each scope a rank PUTs its address under its own rank,
GETs the others' (polling until they are there), meets them in a Gloo barrier, then DELETEs its
key to say it is done.

Why not Horovod's own `RendezvousHandler`: it clears the finished list of *every* scope when any
one scope completes, so a scope whose last DELETE arrives after another scope completed never
completes; its old addresses stay, and the next ``hvd.init()`` reads a peer's stale address
(SIGABRT "Connection refused") or has its fresh one wiped by a late DELETE (a hang in
``connectFullMesh``). This store makes both impossible with one rule, per scope and with no
knowledge of scope sizes:

    Horovod DELETEs only after the scope's barrier, so the first DELETE of generation g means
    every member has read every address of generation g. From then on those values are dead.

A rank's generation in a scope is how many times it has DELETEd there; a PUT is stored with the
putter's generation. The first DELETE that closes generation g drops every value of generation
<= g in that scope; values of a newer generation (a fast rank already in its next
``hvd.init()``) are kept, and a value older than the scope's open generation is never stored.
So a GET can only ever see an address from the generation its peers are in.
"""

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class GenerationStore:
    """The rendezvous state: per scope, each key's value and generation, each rank's DELETEs."""

    def __init__(self):
        self._lock = threading.Lock()
        self._values = {}    # scope -> {key: (generation, value)}
        self._deletes = {}   # scope -> {rank key: DELETEs so far}
        self._open = {}      # scope -> oldest generation still being read

    def put(self, scope, key, value):
        with self._lock:
            # a rank PUTs under its rank ("3") and, for Gloo's local ranks, "rank_3"
            generation = self._deletes.get(scope, {}).get(key.removeprefix("rank_"), 0)
            if generation >= self._open.get(scope, 0):
                self._values.setdefault(scope, {})[key] = (generation, value)

    def get(self, scope, key):
        with self._lock:
            entry = self._values.get(scope, {}).get(key)
            return None if entry is None else entry[1]

    def delete(self, scope, key):
        """`key` (a rank of this scope) is done with its current generation."""
        with self._lock:
            deletes = self._deletes.setdefault(scope, {})
            deletes[key] = deletes.get(key, 0) + 1
            if deletes[key] > self._open.get(scope, 0):
                self._open[scope] = deletes[key]
                values = self._values.get(scope, {})
                for k in [k for k, (generation, _) in values.items() if generation < deletes[key]]:
                    del values[k]

    def keys(self, scope):
        with self._lock:
            return sorted(self._values.get(scope, {}))


class _Handler(BaseHTTPRequestHandler):
    timeout = 3  # seconds to read one request (Horovod's KVStoreHandler uses the same)
    protocol_version = "HTTP/1.0"

    def _scope_key(self):
        parts = self.path.split("/")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            self._reply(400)
            return None
        return parts[1], parts[2]

    def _reply(self, code, body=b""):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def do_GET(self):
        where = self._scope_key()
        if where is not None:
            value = self.server.store.get(*where)
            self._reply(404) if value is None else self._reply(200, value)

    def do_PUT(self):
        where = self._scope_key()
        if where is not None:
            length = int(self.headers.get("Content-Length") or 0)
            self.server.store.put(*where, self.rfile.read(length))
            self._reply(200)

    def do_DELETE(self):
        where = self._scope_key()
        if where is not None:
            self.server.store.delete(*where)
            self._reply(200)

    def log_message(self, format, *args):  # not a line per request in the task's log
        pass


class Rendezvous:
    """The rendezvous server of one launch, on every IPv4 interface, a free port.

    Horovod's own server also takes up to half a second to stop (its serve loop polls at 0.5 s)
    and leaves its socket open; this one stops at once and closes it. Its thread sleeps until a
    connection comes (no poll: it lives as long as the run, beside ranks that need every core);
    `stop` wakes it with a connection of its own.
    """

    def __init__(self, host="0.0.0.0"):
        self.httpd = ThreadingHTTPServer((host, 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.timeout = None  # (`handle_request` waits for a connection, however long)
        self.httpd.store = self.store = GenerationStore()
        self.port = self.httpd.server_address[1]
        self._stopping = False
        self.thread = threading.Thread(target=self._serve, name="hvd-magic-rendezvous",
                                       daemon=True)
        self.thread.start()

    def _serve(self):
        while not self._stopping:
            self.httpd.handle_request()

    def stop(self):
        self._stopping = True
        host = self.httpd.server_address[0]
        try:  # the connection that wakes `_serve` (its handler reads nothing and ends)
            socket.create_connection(("127.0.0.1" if host == "0.0.0.0" else host, self.port),
                                     timeout=5).close()
        except OSError:  # (nothing to wake: the thread cannot be in its wait)
            pass
        self.thread.join(timeout=5)
        self.httpd.server_close()
