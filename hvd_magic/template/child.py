"""A rank forked from the template (`server.py`), before the rank's own entry runs.

What a fresh ``python -m hvd_magic.rank`` gets from `subprocess.Popen` (its own session and
process group, its streams, its environment and folder, default signal handlers) it gets here by
hand; then the very same entry runs (``hvd_magic.rank``'s ``__main__``), so from then on it is a
rank like any other. Library settings read at load time cannot follow a new environment: the
thread counts are applied to the libraries the template already loaded (torch, OpenBLAS), and
numpy's global random state, seeded once in the template, is seeded again.

Never returns: the process ends with the rank's exit code.
"""

import ctypes
import gc
import os
import runpy
import signal
import sys
import tempfile
import traceback


def become_rank(request, fds, sockets, own_fds, ready):
    """`ready`: a pipe's end, closed once this process leads a session of its own with default
    signal handlers (the template replies to the task only then)."""
    code = 1
    try:
        os.setsid()
        _reset_signals()
        os.close(ready)
        gc.enable()  # (of what this rank makes: the template's objects stay frozen, shared)
        for sock in sockets:  # the template's: closed here, never later by a collected object
            try:
                os.close(sock.detach())
            except OSError:
                pass
        for fd in own_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        env = dict(request["env"])
        streams, extra = fds[:3], fds[3:]
        for target, fd in enumerate(streams):
            os.dup2(fd, target)
        for fd in streams:
            if fd not in extra and fd > 2:
                os.close(fd)
        for name, fd in zip(request.get("fd_env", ()), extra):
            os.set_inheritable(fd, True)
            env[name] = str(fd)
        # It dies with the template that reaps it; its task (whose death the template turns
        # into the rank's) is still named, where a fresh rank's parent would be.
        env["HVD_MAGIC_TASK_PID"] = env.get("HVD_MAGIC_PARENT_PID", "")
        env["HVD_MAGIC_PARENT_PID"] = str(os.getppid())
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None  # (in case the template cached its own: TMPDIR is the rank's)
        os.chdir(request["cwd"])
        _apply_threads(env)
        _reseed()
        argv = request["argv"]
        _show_command_line([sys.executable, "-m", *argv])
        sys.argv = list(argv)
        runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reset_signals():
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has it


def _apply_threads(env):
    """OMP_NUM_THREADS and OPENBLAS_NUM_THREADS were read when the template loaded the
    libraries (with 1): give the loaded libraries the rank's own counts."""
    count = _count(env.get("OMP_NUM_THREADS"))
    torch = sys.modules.get("torch")
    if count and torch is not None:  # (no more than the cores it may run on, as a fresh torch)
        torch.set_num_threads(min(count, len(os.sched_getaffinity(0))))
    blas = _count(env.get("OPENBLAS_NUM_THREADS")) or count
    if blas and "numpy" in sys.modules:
        setter = _openblas_setter()
        if setter is not None:
            setter(blas)


def _count(text):
    text = str(text or "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _openblas_setter():
    """OpenBLAS's own thread-count setter, in whichever OpenBLAS numpy loaded (numpy's wheels
    rename its symbols)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line}
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("openblas_set_num_threads", "openblas_set_num_threads64_",
                     "scipy_openblas_set_num_threads", "scipy_openblas_set_num_threads64_"):
            setter = getattr(lib, name, None)
            if setter is not None:
                return setter
    return None


def _reseed():
    """numpy seeds its global generator once, when imported: the template's seed would be every
    forked rank's (Python's `random` reseeds itself after a fork)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def _show_command_line(argv):
    """Write the rank's command line over the template's (padded) one, so `ps` and anything that
    finds ranks by their command line see ``python -m hvd_magic.rank WORKDIR``, as before."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        text = b"\0".join(a.encode() for a in argv) + b"\0"
        if len(text) > end - start:
            return
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(text + b"\0" * (end - start - len(text)))
    except (OSError, ValueError, IndexError):
        pass
