"""A training script on a rank: the file runs as ``__main__``, as ``python train.py args`` would
run it under horovodrun.

`run_script` is the job's function for ``%horovod train.py`` and ``hvd_magic.run_script`` (the
driver pickles a reference to it, and the script's text as its argument: the executor may not see
the notebook's files). Like `runpy.run_path`, the script's module is ``sys.modules["__main__"]``
while it runs (so a class it pickles, e.g. with ``torch.save(model)``, is found again), with
``sys.argv = [path, *args]`` and the script's folder first on ``sys.path``: the folder itself where
this machine sees it, and the copy of its sibling modules that came with the job in any case.

Not for: anything of IPython or Spark (this runs in the rank process).
"""

import os
import sys
import types


class ScriptExit(Exception):
    """The script called ``sys.exit`` with a failure code: this rank failed with that code."""

    def __init__(self, script, code):
        self.code = code
        if isinstance(code, int):
            text = f"{script} exited with code {code} (sys.exit({code}))"
        else:  # sys.exit("message"): Python prints the message and exits with 1
            text = f"{script} exited with code 1: {code}"
        super().__init__(text)


def run_script(path, source, argv):
    """Run the script `source` (read from `path` on the driver) with `argv` as its arguments;
    None when it ends, or calls ``sys.exit(0)`` / ``sys.exit()``. Its sibling modules came with
    the job and are on ``sys.path`` already (`hvd_magic.rank.__main__.install_modules`); its
    folder goes first where this machine sees it (data files beside the script)."""
    folder = os.path.dirname(os.path.abspath(path))
    code = compile(source, os.path.abspath(path), "exec")  # tracebacks name the script's own file
    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=os.path.abspath(path), __builtins__=__builtins__,
                           __cached__=None, __loader__=None, __spec__=None)
    saved = sys.modules.get("__main__"), sys.argv, list(sys.path)
    sys.modules["__main__"] = module
    sys.argv = [path, *argv]
    if os.path.isdir(folder):
        sys.path.insert(0, folder)
    try:
        exec(code, module.__dict__)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            # the script's own frames up to its sys.exit call stay in the traceback
            raise ScriptExit(os.path.basename(path), exc.code).with_traceback(
                exc.__traceback__) from None
    finally:
        sys.modules["__main__"], sys.argv, sys.path[:] = saved
    return None
