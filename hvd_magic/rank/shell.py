"""``!cmd`` lines of a %%horovod cell, run on the rank (there is no IPython there).

IPython's transforms turn ``!ls {path}`` into ``get_ipython().system(...)`` and ``x = !ls`` into
``get_ipython().getoutput(...)``; `hvd_magic.capture` points those calls here. As in IPython,
``{expression}`` in the command is replaced by its value in the cell.
"""

import string
import subprocess
import sys


class _CellFormatter(string.Formatter):
    """``{expression}`` evaluated in the cell's own namespace, as IPython's ``!`` lines do."""

    def __init__(self, namespace):
        self.namespace = namespace

    def get_field(self, field_name, args, kwargs):
        return eval(field_name, self.namespace), field_name


def _expand(cmd, depth):
    frame = sys._getframe(depth + 1)
    namespace = {**frame.f_globals, **frame.f_locals}
    try:
        return _CellFormatter(namespace).vformat(cmd, (), {})
    except Exception:
        return cmd  # as IPython does: a command it cannot expand runs as written


def system(cmd):
    """Run a shell command; its output joins the rank's own (forwarded to the notebook)."""
    cmd = _expand(cmd, 1)
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.call(cmd, shell=True)


def getoutput(cmd, split=True, depth=0):
    """Run a shell command and return its output lines, like IPython's ``x = !cmd``."""
    cmd = _expand(cmd, 1)
    out = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, errors="replace").stdout
    return out.splitlines() if split else out
