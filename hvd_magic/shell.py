"""``!cmd`` lines of a %%horovod cell, run on the rank (there is no IPython there).

IPython's transforms turn ``!ls {path}`` into ``get_ipython().system(...)`` and ``x = !ls`` into
``get_ipython().getoutput(...)``; `hvd_magic.capture` points those calls here.
"""

import subprocess
import sys


def system(cmd):
    """Run a shell command; its output joins the rank's own (forwarded to the notebook)."""
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.call(cmd, shell=True)


def getoutput(cmd, split=True, depth=0):
    """Run a shell command and return its output lines, like IPython's ``x = !cmd``."""
    out = subprocess.run(cmd, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, errors="replace").stdout
    return out.splitlines() if split else out
