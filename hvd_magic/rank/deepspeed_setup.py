"""DeepSpeed on a rank: ``deepspeed.initialize`` and ``deepspeed.init_distributed()`` unchanged in
a cell, and its C++ ops built once per host, in words, never waited on in silence.

- A rank without a GPU of its own gets ``DS_ACCELERATOR=cpu`` (a `--env` or the cell's wins):
  else DeepSpeed guesses and says so on every rank. torchrun's variables (``LOCAL_RANK``
  included: without it DeepSpeed looks for mpi4py) come from `hvd_magic.frameworks.torch`.
- DeepSpeed compiles its ops with ninja the first time they are used (on CPU ranks
  ``init_distributed`` builds ``deepspeed_shm_comm``: 163 s here, cold). They go to one folder
  per host, environment, Python, torch and DeepSpeed release (``TORCH_EXTENSIONS_DIR``,
  `extensions_dir`), where a later run, or ``python -m hvd_magic.prebuild deepspeed``, finds
  them.
- Before a build, the host's rank that builds says what it compiles, why it waits and how to
  prebuild. torch's build lock (a ``lock`` file in the op's folder, held open by its builder) left
  by a process that died building would keep every later build waiting forever at 0% CPU: a lock
  no live process holds is removed and that is said; one a live process holds is named (its pid
  and command) while this rank waits for it.
- Each ``engine.step()`` is the rank's progress on the dashboard (DeepSpeed's ``global_steps``),
  where the cell reports no steps itself (`hvd_magic.report`).
- A ``deepspeed.initialize`` called without a config (neither ``config=`` nor
  ``args.deepspeed_config``) takes ``HVD_MAGIC_DEEPSPEED_CONFIG``'s, where
  `hvd_magic.DeepspeedTorchDistributor` gave one: pyspark's drops it for a function.
- A host without a C++ compiler: the op is skipped where DeepSpeed can run without it
  (`hvd_magic.compat.deepspeed`), and one line says so.

Not for: DeepSpeed's checkpoints (they land where the cell says, relative to the run's folder,
the rank's working directory) or anything of torch.distributed's (`torch_store`, `stall`).
"""

import functools
import hashlib
import os
import shutil
import sys
import time

from . import hooks
from .gpus import OWN

EXTENSIONS = "TORCH_EXTENSIONS_DIR"
CONFIG = "HVD_MAGIC_DEEPSPEED_CONFIG"  # DeepspeedTorchDistributor's config, as JSON
SHM_OP = "deepspeed_shm_comm"


def say(text):
    print(f"hvd_magic: {text}", file=sys.stderr, flush=True)


def extensions_dir(torch_version, deepspeed_version, deepspeed_folder):
    """This host's folder of DeepSpeed's built ops for this Python, torch and DeepSpeed, and the
    folder DeepSpeed is imported from as this Python names it: torch rebuilds an op whose build
    commands changed, and they name DeepSpeed's sources by that path, so two environments (or one
    reached through a symbolic link and by its own path) sharing a folder would rebuild at every
    turn; each gets its own."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    where = hashlib.sha256(os.path.abspath(deepspeed_folder).encode()).hexdigest()[:8]
    tag = (f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch_version}"
           f"-ds{deepspeed_version}-{where}")
    return os.path.join(root, "hvd_magic", "torch_extensions", tag)


def lock_holders(path):
    """The pids of this host's processes that hold `path` open (torch's builder keeps its lock
    file open until it removes it); those whose descriptors cannot be read are not counted."""
    holders = []
    real = os.path.realpath(path)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.path.realpath(f"/proc/{pid}/fd/{fd}") == real for fd in fds):
                holders.append(int(pid))
        except OSError:  # gone, or another user's
            continue
    return holders


def _command(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:120]
    except OSError:
        return "?"


def clear_stale_lock(build_dir, name):
    """Remove `build_dir`'s lock when no live process holds it (looked at twice, 1 s apart, so a
    builder between closing and removing it is not taken for dead); name the holder otherwise.
    Returns "none", "cleared" or "held"."""
    lock = os.path.join(build_dir, "lock")
    if not os.path.exists(lock):
        return "none"
    holders = lock_holders(lock)
    if not holders:
        time.sleep(1)
        holders = lock_holders(lock) if os.path.exists(lock) else None
        if holders == []:
            try:
                os.remove(lock)
            except FileNotFoundError:  # another rank of this host cleared it first
                return "cleared"
            say(f"removed the build lock of DeepSpeed's op {name} ({lock}): the process that held "
                "it died while building (without this, every later build on this host waits "
                "for it forever)")
            return "cleared"
        if holders is None:
            return "none"
    say(f"waiting for process {holders[0]} ({_command(holders[0])}), which is building "
        f"DeepSpeed's op {name} on this host (its lock: {lock})")
    return "held"


def _built(build_dir, name):
    return os.path.exists(os.path.join(build_dir, f"{name}.so"))


def _announcing(load):
    @functools.wraps(load)
    def load_announced(name, *args, **kwargs):
        build_dir = kwargs.get("build_directory") or os.path.join(
            os.environ.get(EXTENSIONS, ""), name)
        # (a lock is looked at even beside a built op: torch takes it to check the build too)
        state = clear_stale_lock(build_dir, name)
        if os.environ.get(EXTENSIONS) and not _built(build_dir, name):
            if state != "held" and os.environ.get("LOCAL_RANK", "0") == "0":
                say(f"DeepSpeed is compiling its C++ op {name} for this host, once (a few "
                    f"minutes: nothing else is said meanwhile); later runs find it in "
                    f"{os.path.dirname(build_dir)}. `python -m hvd_magic.prebuild deepspeed` "
                    "builds it ahead of a run.")
        return load(name, *args, **kwargs)
    return load_announced


def _configured(initialize):
    @functools.wraps(initialize)
    def initialize_configured(*args, **kwargs):
        given = kwargs.get("config") or kwargs.get("config_params") or getattr(
            kwargs.get("args") or (args[0] if args else None), "deepspeed_config", None)
        if not given and os.environ.get(CONFIG):
            import json
            kwargs["config"] = json.loads(os.environ[CONFIG])
        return initialize(*args, **kwargs)
    return initialize_configured


def _counted(step):
    @functools.wraps(step)
    def step_counted(engine, *args, **kwargs):
        value = step(engine, *args, **kwargs)
        from .reporting import framework_step
        framework_step(engine.global_steps)  # (it moves at a gradient-accumulation boundary)
        return value
    return step_counted


def compiler():
    """The C++ compiler torch's builds would use, or None."""
    return shutil.which(os.environ.get("CXX", "c++"))


def _on_import(deepspeed):
    import torch
    import torch.utils.cpp_extension as cpp_extension
    os.environ.setdefault(EXTENSIONS, extensions_dir(torch.__version__, deepspeed.__version__,
                                                     os.path.dirname(deepspeed.__file__)))
    cpp_extension.load = _announcing(cpp_extension.load)
    deepspeed.initialize = _configured(deepspeed.initialize)
    from deepspeed.runtime.engine import DeepSpeedEngine
    DeepSpeedEngine.step = _counted(DeepSpeedEngine.step)
    if compiler() is None:
        from ..compat.deepspeed import skip_op
        if skip_op(SHM_OP, "no C++ compiler"):
            say(f"no C++ compiler on this host ({os.environ.get('CXX', 'c++')}): DeepSpeed runs "
                f"without its op {SHM_OP} (torch.distributed's all-reduce instead); install one "
                "(g++) for it, and for any op the cell's config asks for (FusedAdam...)")


def install():
    """DeepSpeed's accelerator now; its ops' folder and builds hooked for when the cell imports
    it."""
    if not os.environ.get(OWN):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    hooks.when_imported("deepspeed", _on_import)
