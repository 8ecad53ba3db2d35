"""How a task starts its rank process: forked from this host's template (`hvd_magic.template`),
or the old way, a fresh ``python -m hvd_magic.rank`` (`subprocess.Popen`).

A run that forks (`TaskSettings.fork`: ``--fresh`` off, the default:
`hvd_magic.config.FRESH_BY_DEFAULT`) gets a forked rank where a template can serve;
otherwise, or when no template can be had, the rank starts fresh. Either way the task gets the same
kind of handle (``pid``, ``poll``, ``wait``, ``send_signal``, the pipes), and the rank the same
environment, folder, streams and process group of its own.
"""

import os
import pickle
import subprocess
import sys

from ..template import client, wanted


def start_rank(settings, argv, env, cwd, fd_env):
    """The rank process for `argv` (``["hvd_magic.rank", WORKDIR, ...]``); a warm session's
    rank takes its cells on stdin. `fd_env` ({variable: fd}: the events pipe, the stacks probe)
    stay open in it, each variable naming its number there."""
    if settings.fork:
        job = pickle.loads(settings.job)  # a dict of pickles: nothing of the user's is loaded
        path = env.get("PYTHONPATH", "").split(os.pathsep)  # (what was shipped comes first)
        modules = wanted(job, path) if job else ()  # (a warm session's: what the template holds)
        proc = client.fork_rank(argv, env, cwd, modules=modules, stdin=settings.session,
                                fd_env=fd_env)
        if proc is not None:
            return proc
    return subprocess.Popen(
        [sys.executable, "-m", *argv],
        stdin=subprocess.PIPE if settings.session else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=tuple(fd_env.values()), env=env, cwd=cwd, start_new_session=True)
