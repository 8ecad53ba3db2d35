"""The task's side of a template (`server.py`): find or start this host's, ask it for a rank.

`fork_rank` returns a `ForkedRank`, a handle with what the task uses of a `subprocess.Popen`
(``pid``, ``poll``, ``wait``, ``returncode``, ``send_signal``, the ``stdin``/``stdout``/``stderr``
pipes), or None where no template can serve (the task then starts the rank the old way).

A template serves one owner (the notebook's kernel, or the executor's JVM: `owner`) and one
interpreter set-up (the Python, its ``PYTHONPATH``, the dynamic loader's variables: what a fork
cannot change); its socket's name is made of both, in a private 0700 folder of this user.
"""

import fcntl
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from ..task.caches import not_private
from ..task.threads import THREAD_VARS
from . import server

# What a forked rank cannot change from the template's: read when the interpreter started.
START_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "LD_LIBRARY_PATH", "LD_PRELOAD",
              "PYTHONNOUSERSITE", "VIRTUAL_ENV", "HVD_MAGIC_TEMPLATE_IDLE")
START_SECONDS = 30  # a template that does not listen by then is not used (the rank starts fresh)
FORK_SECONDS = 300  # its imports (the first cell's) and the fork, on a loaded host
# Room for a rank to write its own command line over the template's (`child.py`): blanks, which
# `ps` shows as nothing (dots showed as a thousand of them after the template's command line).
ARGV_PADDING = " " * 1024


def folder():
    """This user's private folder of template sockets; None where it is not private."""
    path = os.path.join(tempfile.gettempdir(), f"hvd_magic-templates-{os.getuid()}")
    try:
        return path if not_private(path) is None else None  # someone else's, or opened up
    except OSError:
        return None


def owner():
    """Whose life the template follows: the Spark executor's JVM above this task's Python worker,
    else this process (the notebook's kernel for ``--np -N``)."""
    pid = os.getppid()
    for _ in range(4):
        if pid <= 1:
            break
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() == "java":
                    return pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return os.getpid()


def _started(pid):
    """A process's start time (ticks since boot): with the pid, it names one process forever."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "0"


def socket_path(env, owner_pid=None):
    where = folder()
    if where is None:
        return None
    owner_pid = owner() if owner_pid is None else owner_pid
    key = json.dumps([sys.executable, os.path.dirname(os.path.dirname(__file__)), owner_pid,
                      _started(owner_pid), [env.get(n) for n in START_VARS]])
    return os.path.join(where, hashlib.sha256(key.encode()).hexdigest()[:20] + ".sock")


def _connect(path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        raise
    return sock


def connect(env, start=True):
    """A connection to this host's template for `env` (started if there is none and `start`);
    None where none can be had."""
    path = socket_path(env)
    if path is None:
        return None
    try:
        return _connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        if not start:
            return None
    except OSError:  # anything else at that path (not our socket): the rank starts fresh
        return None
    with open(path + ".lock", "w") as lock:  # one starter among this host's tasks
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        except OSError:
            return None
        try:
            os.unlink(path)  # a template killed outright left its socket
        except FileNotFoundError:
            pass
        if not _start(path, env):
            return None
        try:
            return _connect(path)
        except OSError:
            return None


def _start(path, env):
    tenv = dict(env)
    tenv.update({name: "1" for name in THREAD_VARS})  # no library pools in the template
    tenv["PYTHONUNBUFFERED"] = "1"
    with open(path + ".log", "ab") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "hvd_magic.template.server", path, str(owner()), ARGV_PADDING],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=tenv, cwd="/",
            start_new_session=True)
    try:
        # It exits once the socket listens; the template itself lives on (`server.main`).
        return first.wait(timeout=START_SECONDS) == 0
    except subprocess.TimeoutExpired:
        first.kill()
        first.wait()
        return False


def fork_rank(argv, env, cwd, modules=(), stdin=False, fd_env=None):
    """A rank forked from the template: ``python -m`` `argv` as it would run, with `env`, in
    `cwd`; `stdin` a pipe (a warm session's cells) or /dev/null; `fd_env` ({variable: fd}) kept
    open in the rank, its number in that variable (``HVD_MAGIC_EVENT_FD``). The template first
    imports the `modules` it does not hold. None where no template can serve."""
    fd_env = dict(fd_env or {})
    sock = connect(env)
    if sock is None:
        return None
    ours, theirs = [], []
    try:
        if stdin:
            r, w = os.pipe()
            ours.append(w)
            theirs.append(r)
        else:
            theirs.append(os.open(os.devnull, os.O_RDONLY))
        for _ in ("stdout", "stderr"):
            r, w = os.pipe()
            ours.append(r)
            theirs.append(w)
        request = {"op": "fork", "modules": list(modules), "env": env, "cwd": cwd,
                   "argv": list(argv), "fd_env": list(fd_env)}
        server.send(sock, request, theirs + list(fd_env.values()))
        sock.settimeout(FORK_SECONDS)  # a template stuck in an import: the rank starts fresh
        reply, _ = server.recv(sock)
        sock.settimeout(None)
    except (OSError, ValueError):
        reply = None
    finally:
        for fd in theirs:
            os.close(fd)
    if not reply or "pid" not in reply:
        sock.close()
        for fd in ours:
            os.close(fd)
        return None
    files = [os.fdopen(fd, "wb" if stdin and i == 0 else "rb") for i, fd in enumerate(ours)]
    if not stdin:
        files.insert(0, None)
    return ForkedRank(sock, reply["pid"], *files)


class ForkedRank:
    """A forked rank, as the task sees it: what it uses of `subprocess.Popen`. The rank is the
    template's child: the template reaps it and sends its exit status over this connection."""

    def __init__(self, sock, pid, stdin, stdout, stderr):
        self.pid, self.stdin, self.stdout, self.stderr = pid, stdin, stdout, stderr
        self.returncode = None
        self.forked = True
        self._sock = sock
        self._ended = threading.Event()
        threading.Thread(target=self._watch, name=f"hvd-magic-rank-{pid}", daemon=True).start()

    def _watch(self):
        try:
            reply, _ = server.recv(self._sock)
        except (OSError, ValueError):
            reply = None
        # No word: the template itself went, and its ranks were killed with it.
        code = reply.get("exit") if reply else None
        self.returncode = -signal.SIGKILL if code is None else code
        self._sock.close()
        self._ended.set()

    def poll(self):
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout=None):
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"rank {self.pid}", timeout)
        return self.returncode

    def send_signal(self, sig):
        if not self._ended.is_set():
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def hold(env, modules):
    """This host's template for `env`, started if there is none, importing `modules` now: the
    ranks of a later run are forked at once. The modules it holds, or None where no template
    can serve. (Blocks while it imports: call it from a thread.)"""
    sock = connect(env)
    if sock is None:
        return None
    try:
        server.send(sock, {"op": "hold", "modules": list(modules)})
        sock.settimeout(FORK_SECONDS)
        reply, _ = server.recv(sock)
        return reply.get("held") if reply else None
    except (OSError, ValueError):
        return None
    finally:
        sock.close()


def status(env=None):
    """What this process's template (for `env`, default this process's) says of itself: pid,
    modules, rss, pss, ranks; None where there is none."""
    sock = connect(dict(os.environ) if env is None else env, start=False)
    if sock is None:
        return None
    try:
        server.send(sock, {"op": "status"})
        reply, _ = server.recv(sock)
        return reply
    except (OSError, ValueError):
        return None
    finally:
        sock.close()
