"""What a process removes even when it is SIGKILLed: a small cleanup process of its own.

A rank's folder (the pickled job, the notebook's values) and a notebook's value file in
/dev/shm are removed by the process that made them, in a ``finally`` or a finalizer, which a
SIGKILL never reaches (a killed notebook, a Spark task whose Python worker was killed). So the
first time a process has something to remove it starts one cleanup process (``python -I -S`` on
this file: no hvd_magic import, no site packages) in a session of its own, holding the read end
of a pipe whose write end only its owner holds. The owner says on it what to remove (`keep`),
which processes still use it (`keep(path, pid)`), and what it removed itself (`forget`). When
the pipe ends (the owner gone, whatever the signal) the cleanup process waits for those
processes to be gone (a rank dies with its task: PR_SET_PDEATHSIG) and removes what is still
registered. It touches only paths its owner registered: other notebooks run on the same host.

Not for: the processes themselves (each task ends its rank's process group), or anything a
killed owner's next start should find: nothing is matched by name or command line.
"""

import json
import os
import shutil
import subprocess
import sys
import threading
import time

PIDS_GONE_WITHIN = 10.0  # seconds, after the owner ends, for its ranks to be gone


class Cleanup:
    """The owner's side: this process's cleanup process, started at the first `keep`.

    One per process (`here()`): the cleanup process follows the process that wrote to it, so a
    forked child (a PySpark worker forked from its daemon) gets its own."""

    _here = None
    _made = threading.Lock()

    def __init__(self):
        self.pid = os.getpid()
        self.kept = {}  # path -> [(pid, start time)]: said again to a new cleanup process
        self.lock = threading.Lock()
        self.proc = None
        self.unable = False       # no cleanup process can be started here (said once)

    @classmethod
    def here(cls):
        with cls._made:
            if cls._here is None or cls._here.pid != os.getpid():
                cls._here = cls()
            return cls._here

    def keep(self, path, pid=None):
        """Remove `path` if this process ends without `forget(path)`; once process `pid` (if
        given) is gone too."""
        with self.lock:
            pids = self.kept.setdefault(path, [])
            if pid is not None:
                pids.append((pid, _started(pid)))
            self._say(["keep", path, pids])

    def forget(self, path):
        """`path` was removed (or handed on) by its owner: not the cleanup process's any more."""
        with self.lock:
            if self.kept.pop(path, None) is not None and self.proc is not None:
                self._say(["forget", path])

    def _say(self, message):
        line = (json.dumps(message) + "\n").encode()
        for _ in range(2):
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._start()
                if self.proc is None:
                    return
                # a cleanup process that ended (killed by hand) is replaced; it hears everything
                line = b"".join((json.dumps(["keep", p, pids]) + "\n").encode()
                                for p, pids in self.kept.items())
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
                return
            except OSError:
                self.proc = None

    def _start(self):
        """The cleanup process: this file run, or its source where the package was imported
        from a zip (a cluster's executors import the hvd_magic Spark shipped them so); None
        (said once) where no process can be started."""
        if self.unable:
            return None
        try:
            return subprocess.Popen(
                [sys.executable, "-I", "-S", *_program()], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            self.unable = True
            print(f"hvd_magic: no cleanup process ({e}): a killed notebook or task leaves its "
                  "rank folders and value files behind", file=sys.stderr)
            return None


def _program():
    """The arguments that run this module as a script: its file, or its source (``-c``)."""
    script = os.path.abspath(__file__)
    if os.path.isfile(script) and script.endswith(".py"):
        return [script]
    source = __loader__.get_source(__name__) if hasattr(__loader__, "get_source") else None
    if not source:
        raise OSError(f"{script} is not a file and its source cannot be read")
    return ["-c", source]


def _started(pid):
    """Process `pid`'s start time (with the pid, it names one process); None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def remove(path):
    """`path` gone, a folder with all it holds; nothing said if it was gone already."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


def main(stream):
    """The cleanup process: read the owner's messages until the pipe ends, then remove what is
    left, each path once the processes using it are gone (or after `PIDS_GONE_WITHIN` seconds)."""
    kept = {}
    for line in stream:
        try:
            message = json.loads(line)
        except ValueError:
            continue  # (a line cut by the owner's death)
        if message[0] == "keep":
            kept[message[1]] = message[2]
        elif message[0] == "forget":
            kept.pop(message[1], None)
    gone_by = time.monotonic() + PIDS_GONE_WITHIN
    while kept:
        for path, pids in list(kept.items()):
            if time.monotonic() >= gone_by or not any(
                    started and _started(pid) == started for pid, started in pids):
                remove(path)
                del kept[path]
        time.sleep(0.1)


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a Ctrl-C meant for its owner)
    main(sys.stdin.buffer)
