"""The rank process: ``python -m hvd_magic.rank WORKDIR``.

Started by a task (`hvd_magic.task.runner`) with Horovod's environment already set. It loads the job the
task wrote to ``WORKDIR/job.pkl`` (the cell's function and its arguments, pickled by cloudpickle),
runs it, and leaves either ``result.pkl`` or ``error.json`` behind. Everything it prints goes to its
stdout/stderr pipes, which the task forwards; structured events (progress, state) go as JSON lines
to the file descriptor named by ``HVD_MAGIC_EVENT_FD``.

Not for: anything Spark or IPython. This process must start as a fresh interpreter so that the
cell's own imports are what load its modules.
"""

import builtins
import json
import linecache
import os
import signal
import sys
import traceback

from .. import payload
from ..errors import name_cells, name_cells_in_warnings
from . import (deepspeed_setup, elastic_world, gpus, jax_setup, keras_alias, profile, reporting,
               script, stacks, stall, stream, torch_store, trainers, trial)

# Exit codes the task reads: a user exception (error.json written), a result that cannot travel.
EXIT_USER_ERROR = 1
EXIT_RESULT_ERROR = 3
MODULES_BEFORE_CALL = frozenset()


def _die_with_parent():
    """Ask Linux to kill this process when the task that started it dies (Spark cancelled it)."""
    parent = int(os.environ.get("HVD_MAGIC_PARENT_PID", "0"))
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(137)


def _on_stop(signum, frame):
    """SIGTERM from the task (the run stops): write out the timeline's queued events and the
    profile so far, then go."""
    _stop_timeline()
    profile.finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signum)


def _register_source(filename, source):
    # The cell's code was compiled on the driver; give tracebacks and warnings its text here too.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    name_cells_in_warnings()


def _users_tb(exc):
    """The exception's traceback without this bootstrap's own frames."""
    tb = exc.__traceback__
    here = os.path.dirname(os.path.abspath(__file__))  # this bootstrap and rank/session.py
    while tb is not None and os.path.dirname(tb.tb_frame.f_code.co_filename) == here:
        tb = tb.tb_next
    return tb


def _user_traceback(exc):
    """The exception's traceback as text, a cell's frames named as IPython names them
    (``Cell In[5], line 6``)."""
    return name_cells("".join(traceback.format_exception(type(exc), exc, _users_tb(exc))))


def _did_you_mean(exc):
    """Python's own hint for a mistyped name (". Did you mean: 'scale'?"), which Python 3.10
    and 3.11 print only from the interpreter's own hook, not in `traceback`'s text; None where
    there is none, or where `traceback` adds it itself (3.12 on)."""
    name = getattr(exc, "name", None)
    if sys.version_info >= (3, 12) or not isinstance(name, str) or \
            type(exc) not in (NameError, UnboundLocalError, AttributeError):
        return None
    if isinstance(exc, AttributeError):
        candidates = dir(getattr(exc, "obj", None)) if hasattr(exc, "obj") else []
    else:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        frame = tb.tb_frame if tb is not None else None
        candidates = ([*frame.f_locals, *frame.f_globals, *dir(builtins)]
                      if frame is not None else [])
    import difflib
    close = difflib.get_close_matches(name, [c for c in candidates if c != name], n=1,
                                      cutoff=0.7)
    return f". Did you mean: '{close[0]}'?" if close else None


def error_record(exc):
    """What error.json (or a session's exit event) says of an exception: its type, message,
    traceback text, and its frames with their locals for ``%debug`` (`frames.capture`)."""
    from . import frames

    record = {"type": type(exc).__name__, "module": type(exc).__module__,
              "message": str(exc), "traceback": _user_traceback(exc)}
    hint = _did_you_mean(exc)
    if hint:  # where Python prints it itself: on the exception's line
        record["message"] += hint
        record["traceback"] = record["traceback"].rstrip("\n") + hint + "\n"
    if isinstance(exc, ImportError):  # which Python lacked it: the driver's hint names it
        record["python"] = sys.executable
    if stall.code_error(exc):  # its own socket, not a peer's: never a bystander (errors.py)
        record["cause"] = "code"
    try:
        record["postmortem"] = frames.capture(_users_tb(exc))
    except Exception:  # noqa: BLE001  (the traceback text is enough to go on)
        pass
    return record


def _horovod_rank():
    """This process's Horovod rank now: in an elastic run it changes as the ring re-forms, so
    Horovod's own word first, then the rank it was started as."""
    for name in ("horovod.torch", "horovod.tensorflow", "horovod.keras"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "rank"):
            try:
                return module.rank()
            except Exception:  # not initialized, or shut down by the cell
                pass
    return int(os.environ.get("HOROVOD_RANK", "0"))


def _exports(scope, names):
    """Rank 0's values of the --export names (other ranks send none back)."""
    if not names or _horovod_rank() != 0:
        return None
    missing = [n for n in names if n not in scope]
    if missing:
        raise NameError(f"--export {','.join(missing)}: not defined on rank 0 at the end of the "
                        f"cell (it defines: {', '.join(sorted(k for k in scope if not k.startswith('_'))) or 'nothing'})")
    return {n: scope[n] for n in names}


def install_modules(sources, where):
    """The notebook's own modules that came with the job (`hvd_magic.capture.modules`): written
    under `where`, first on sys.path, so `import mylib` works where the notebook's folder is not."""
    if not sources:
        return
    for rel, source in sources.items():
        path = os.path.join(where, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
    if where not in sys.path:
        sys.path.insert(0, where)


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def _set_up():
    """What a rank of either kind sets up before its first job: its end with its parent, its
    stop and stack dumps, and the hooks put in the libraries a cell may import."""
    _die_with_parent()
    stacks.install()
    signal.signal(signal.SIGTERM, _on_stop)
    reporting.install_tqdm_hook()
    stall.install()
    torch_store.install()
    trainers.install()
    gpus.install()  # the rank's own GPU, where the cell never pins one
    jax_setup.install()  # JAX's devices; its cluster found by a bare initialize()
    deepspeed_setup.install()  # DeepSpeed's accelerator; its ops built once per host, in words


def main(workdir):
    _set_up()
    profile.install()  # --timeline of a torch job without Horovod: its optimizer steps counted
    keras_alias.install()  # before unpickling: the job may refer to `keras` by name
    import cloudpickle  # noqa: F401  (needed to unpickle the job)
    import pickle

    with open(os.path.join(workdir, "job.pkl"), "rb") as f:
        job = pickle.load(f)
    for filename, source in job.get("sources", {}).items():
        _register_source(filename, source)
    install_modules(job.get("modules"), os.path.join(workdir, "modules"))
    trainers.tensorboard_without_tensorflow(job.get("imports", ()))  # (the job's reading)
    stream.use_plan(job.get("data"))  # --data: what hvd_magic.shard() and the batches read
    reporting.state("running", fresh=reporting.fresh())
    try:
        fn = pickle.loads(job["fn"])
        args = [pickle.loads(b) for b in job["args"]]
        kwargs = {name: payload.load(b) for name, b in job["kwargs"].items()}
        here = elastic_world.world()  # an elastic run's (None in others)
        if elastic_world.active():  # an elastic torch run: wait for the first world with us
            here.join()
        global MODULES_BEFORE_CALL  # what was loaded before the cell's own imports ran (tests)
        MODULES_BEFORE_CALL = frozenset(sys.modules)
        value = fn(*args, **kwargs)
        if job.get("cell"):
            value, scope = value
            value = (value, _exports(scope, job.get("export", ())))
    except trial.TrialStopped as stopped:  # a sweep stopped this trial: a clean end, no value
        reporting.send({"t": "trial_stopped", "step": stopped.step})
        value = (None, {}) if job.get("cell") else None
    except BaseException as exc:  # the user's code may raise anything, SystemExit included
        sys.stdout.flush()
        sys.stderr.flush()
        error = error_record(exc)
        if isinstance(exc, script.ScriptExit):  # the terminal command exits with it
            error["exit_code"] = exc.code if isinstance(exc.code, int) else 1
        from . import buildcheck  # only when something failed: a rank starts with little loaded
        mismatch = buildcheck.explain(exc)
        if mismatch:  # an undefined symbol from a .so says nothing to a user
            error.update(type="HorovodBuildMismatch", module=__name__, message=mismatch)
        _write_json(os.path.join(workdir, "error.json"), error)
        return EXIT_USER_ERROR
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        data = payload.cloud_dumps(value)
    except Exception as exc:
        _write_json(os.path.join(workdir, "error.json"), {
            "type": "ResultError",
            "module": __name__,
            "message": f"the value this rank returned ({type(value).__name__}) cannot be sent "
                       f"back to the notebook: {exc}. Return something picklable, or end the "
                       f"cell with `;`.",
            "traceback": "",
        })
        return EXIT_RESULT_ERROR
    tmp = os.path.join(workdir, "result.pkl.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, os.path.join(workdir, "result.pkl"))
    reporting.state("done")
    return 0


def _stop_timeline():
    """Write out the rest of rank 0's Horovod timeline, however the cell ended.

    Horovod's shutdown (and the process's exit) drops the events still queued for its timeline
    writer thread, i.e. the last operations; stopping the timeline waits until they are written
    and closes the file. A local call, not a collective, so it is safe after a failure too; where
    no timeline is being written it returns at once.
    """
    for name in ("horovod.torch", "horovod.tensorflow", "horovod.keras"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "stop_timeline"):
            try:
                module.stop_timeline()
            except Exception:  # Horovod not initialized, or shut down by the cell itself
                pass
            return


def _shutdown_horovod():
    """Shut Horovod down in step with the other ranks."""
    for name in ("horovod.torch", "horovod.tensorflow", "horovod.keras"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "shutdown"):
            try:
                module.shutdown()
            except Exception:
                pass


def main_session(workdir):
    """A rank of a warm session: cells one after another (see `hvd_magic.rank.session`)."""
    from . import session

    _set_up()
    keras_alias.install()  # `import keras` as in a cell that is not a session's
    here = elastic_world.world()  # an elastic session's (None in others)
    if elastic_world.active():  # torch.distributed's: the first world's variables
        here.join()
    return session.serve(workdir, error_record, _exports, _register_source, install_modules)


if __name__ == "__main__":
    code = (main_session if "--session" in sys.argv[2:] else main)(sys.argv[1])
    _stop_timeline()
    profile.finish()
    if code == 0:
        _shutdown_horovod()
        torch_store.release()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip the rest of interpreter teardown: library threads left running can crash it, and
    # everything this process owes the task is already on disk.
    os._exit(code)
