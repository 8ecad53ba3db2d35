"""The template process: ``python -m hvd_magic.template.server SOCKET OWNER``.

One per host and owner (the notebook's kernel for ``--np -N``; the executor's JVM for Spark),
started by the first task that wants a forked rank (`client.py`). It listens on a Unix socket in
a private (0700) folder, never on TCP. Each connection is one request, a JSON message:

- ``{"op": "fork", "modules", "env", "cwd", "argv", "fd_env"}`` with the rank's stdin, stdout,
  stderr and its extra descriptors attached (SCM_RIGHTS): the template first imports the
  `modules` it does not hold yet (the first cell that imports a framework waits for that once),
  forks, answers ``{"pid"}``, and ``{"exit": code}`` when it has reaped the rank (the code as
  `subprocess.Popen.returncode` gives it). The connection closing first means the task is gone:
  the rank's process group is killed, as a rank dies with its task when started the old way;
- ``{"op": "hold", "modules"}``: import them now (the notebook's imports, at ``%load_ext``:
  the first cell's ranks are then forked at once); ``{"held"}`` once done;
- ``{"op": "status"}``: its pid, the modules it holds, its memory (RSS, PSS), its live ranks.

It runs one thread and starts none: imports happen with every library's thread count at 1 (no
pools), and a fork from a single-threaded process is a clean copy. It ends when its owner ends
(a pidfd, polled where there is none), after `IDLE_SECONDS` with no rank and no request, or on
SIGTERM; its ranks go with it (each is told to die with its parent: rank/__main__.py). Its
stdout/stderr go to ``SOCKET.log``.
"""

import gc
import json
import os
import selectors
import signal
import socket
import sys
import time

IDLE_SECONDS = float(os.environ.get("HVD_MAGIC_TEMPLATE_IDLE", 600))
MAX_MESSAGE = 1 << 20  # a request carries a rank's whole environment
MAX_FDS = 8


def send(sock, obj, fds=()):
    data = json.dumps(obj).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def recv(sock):
    """(message or None at the end, descriptors that came with it)."""
    data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    return (json.loads(data) if data else None), fds


def memory():
    """(RSS, PSS) of this process in bytes; PSS counts pages shared with the ranks once."""
    found = {}
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Pss"):
                    found[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return found.get("Rss"), found.get("Pss")


class Template:
    def __init__(self, listener, path, owner):
        self.listener, self.path, self.owner = listener, path, owner
        self.held = []
        self.inode = os.stat(path).st_ino
        self.ranks = {}      # pid -> the connection that asked for it
        self.pending = {}    # connection -> None until its fork
        self.last_use = time.monotonic()
        self.selector = selectors.DefaultSelector()
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through the pipe
        self.selector.register(self.wake_r, selectors.EVENT_READ, "reap")
        try:
            self.owner_fd = os.pidfd_open(owner)
            self.selector.register(self.owner_fd, selectors.EVENT_READ, "owner")
        except (AttributeError, OSError):  # no pidfd (old kernel): polled in the loop
            self.owner_fd = None

    def own_fds(self):
        """Descriptors of the template itself: a forked rank closes them (`child.py`)."""
        fds = [self.wake_r, self.wake_w, self.selector.fileno()]
        return fds + ([self.owner_fd] if self.owner_fd is not None else [])

    def sockets(self):
        return [self.listener, *self.pending, *self.ranks.values()]

    def serve(self):
        while True:
            events = self.selector.select(timeout=min(IDLE_SECONDS, 1.0 if self.owner_fd is None else 10.0))
            for key, _ in events:
                if key.data == "owner":
                    return "owner ended"
                handler = getattr(self, "_" + key.data) if isinstance(key.data, str) else self._conn
                handler(key)
            if self.owner_fd is None and not os.path.exists(f"/proc/{self.owner}"):
                return "owner ended"
            if not self.ranks and not self.pending and \
                    time.monotonic() - self.last_use > IDLE_SECONDS:
                return "idle"

    def _accept(self, _key):
        conn, _ = self.listener.accept()
        self.pending[conn] = None
        self.selector.register(conn, selectors.EVENT_READ, conn)
        self.last_use = time.monotonic()

    def _conn(self, key):
        conn = key.data
        if conn not in self.pending:  # a rank's task closed its end: the rank goes with it
            self._task_gone(conn)
            return
        try:
            request, fds = recv(conn)
        except (OSError, ValueError):
            request, fds = None, []
        if request is None:
            self._drop(conn)
        elif request.get("op") == "fork":
            self._fork(conn, request, fds)
        elif request.get("op") == "hold":
            self._hold(request.get("modules", ()))
            send(conn, {"held": self.held})
            self._drop(conn)
        elif request.get("op") == "status":
            rss, pss = memory()
            send(conn, {"pid": os.getpid(), "modules": self.held, "rss": rss, "pss": pss,
                        "ranks": len(self.ranks), "owner": self.owner})
            self._drop(conn)
        else:
            send(conn, {"error": f"unknown request {request.get('op')!r}"})
            self._drop(conn)
        self.last_use = time.monotonic()

    def _fork(self, conn, request, fds):
        from . import child

        self._hold(request.get("modules", ()))
        sys.stdout.flush()
        sys.stderr.flush()
        ready_r, ready_w = os.pipe()
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)  # (become_rank never returns)
            child.become_rank(request, fds, self.sockets(), self.own_fds(), ready_w)
        os.close(ready_w)
        # The task gets the pid once the rank is a session (a process group) of its own with
        # default signal handlers: a stop sent at once (a Cancel while the ranks start) then
        # reaches its group, and never runs the template's own handlers.
        os.read(ready_r, 1)  # (end of file: it closed its end, or died)
        os.close(ready_r)
        for fd in fds:  # the rank's copies only: its streams end when it (and its children) end
            os.close(fd)
        del self.pending[conn]
        self.ranks[pid] = conn
        try:
            send(conn, {"pid": pid})
        except OSError:
            self._task_gone(conn)

    def _hold(self, modules):
        for name in modules:
            if name in self.held:
                continue
            try:
                __import__(name)
            except Exception as exc:  # the rank imports it itself and reports the real error
                print(f"template: import {name} failed: {exc!r}", flush=True)
                continue
            self.held.append(name)

    def _reap(self, _key):
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.ranks.pop(pid, None)
            if conn is not None:
                try:
                    send(conn, {"exit": os.waitstatus_to_exitcode(status)})
                except OSError:
                    pass
                self._drop(conn)
            self.last_use = time.monotonic()

    def _task_gone(self, conn):
        for pid, c in list(self.ranks.items()):
            if c is conn:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        # the rank stays in `ranks` until reaped; its connection is of no more use
        self.selector.unregister(conn)

    def _drop(self, conn):
        self.pending.pop(conn, None)
        try:
            self.selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def close(self):
        for pid in list(self.ranks):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            ours = os.stat(self.path).st_ino == self.inode  # not a newer template's socket
        except OSError:
            ours = False
        for path in (self.path, self.path + ".log", self.path + ".lock") if ours else ():
            try:
                os.unlink(path)
            except OSError:
                pass


def main(path, owner):
    # No cyclic collection here, and every object frozen before each fork (`_fork`): a rank's
    # first collection would otherwise walk, and so write to, every object the template holds
    # (torch's are hundreds of MB), copying those pages into each rank at once. The children
    # collect again (`child.become_rank`), only what they made themselves.
    gc.disable()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    # Detach from the task that started us: our starter waits for this first process, which
    # exits once the socket listens; the template lives on in its own session, not a child of
    # Spark's Python worker (which would leave it a zombie) nor in its process group.
    if os.fork():
        os._exit(0)
    template = Template(listener, path, owner)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # through `close`: no stale socket
    try:
        why = template.serve()
    finally:
        template.close()
    print(f"template: ended ({why})", flush=True)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
