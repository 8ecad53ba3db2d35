"""How a task starts its rank process: forked from this host's template (`hvd_magic.template`),
or the old way, a fresh ``python -m hvd_magic.rank`` (`subprocess.Popen`).

A forked rank is the default where a template can serve; ``--fresh`` (`TaskSettings.fork`
False), or a template that cannot be had, starts it fresh. Either way the task gets the same
kind of handle (``pid``, ``poll``, ``wait``, ``send_signal``, the pipes), and the rank the same
environment, folder, streams and process group of its own.
"""

import pickle
import subprocess
import sys

from ..template import client, wanted


def start_rank(settings, argv, env, cwd, events_fd):
    """The rank process for `argv` (``["hvd_magic.rank", WORKDIR, ...]``); a warm session's
    rank takes its cells on stdin. `events_fd` stays open in it (``HVD_MAGIC_EVENT_FD``)."""
    if settings.fork:
        job = pickle.loads(settings.job)  # a dict of pickles: nothing of the user's is loaded
        modules = wanted(job) if job else ()  # (a warm session's: what the template holds)
        proc = client.fork_rank(argv, env, cwd, modules=modules, stdin=settings.session,
                                fd_env={"HVD_MAGIC_EVENT_FD": events_fd})
        if proc is not None:
            return proc
    return subprocess.Popen(
        [sys.executable, "-m", *argv],
        stdin=subprocess.PIPE if settings.session else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        pass_fds=(events_fd,), env=env, cwd=cwd, start_new_session=True)
