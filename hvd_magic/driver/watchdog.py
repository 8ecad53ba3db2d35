"""The hang watchdog, driver side: ranks wait for peers that will not come, or for something
outside the ranks.

Horovod never notices a rank that stopped calling collectives (its stall inspector does not run
with Gloo): some ranks finished, or are busy elsewhere, while the others wait forever. Nor does it
say anything while ranks wait in ``hvd.init()`` for a peer that never calls it (a branch on the
rank, an exception before it): Gloo gives up only after several times its timeout. The ranks
report waits longer than a few seconds, and in what (`hvd_magic.rank.stall`); this compares them.
A rank whose process tree used no CPU for the stall timeout, in no collective, waits on
something else (a lock, a file, the network): its task's samples (`driver/usage.py`) say so.
"""

import time

from .ranks import ranks_text

# A wait in hvd.init() is reported after the stall timeout, but never sooner than
# INIT_STALL_MIN (ranks enter hvd.init() seconds apart on a loaded machine: they start and import
# their frameworks at different speeds) nor later than INIT_STALL_MAX (a rank missing from
# hvd.init() is a bug to report early, where a collective may legitimately wait for a rank that
# evaluates alone).
INIT_STALL_MIN = 10.0
INIT_STALL_MAX = 30.0
# The waits every rank must enter before any collective, as the ranks name them, and as the
# messages name them (Horovod's, torch.distributed's, JAX's).
INIT_OPS = {"init": "hvd.init()", "init_process_group": "dist.init_process_group()",
            "jax.distributed.initialize": "jax.distributed.initialize()"}


def init_stall_seconds(stall_timeout):
    return min(max(stall_timeout, INIT_STALL_MIN), INIT_STALL_MAX)


def stall_message(ranks, stall_timeout, now=None):
    """The watchdog's message when ranks have waited too long for others, or for something
    outside the ranks, else None."""
    now = time.monotonic() if now is None else now
    return _collective_message(ranks, stall_timeout, now) or \
        idle_message(ranks, stall_timeout, now)


def idle_message(ranks, stall_timeout, now):
    """Ranks that used no CPU (nor GPU) for `stall_timeout` s while in no collective: they wait
    on something outside the ranks (a lock, a file, the network, a sleep), which no collective
    wait says (a DeepSpeed cell sat 7 minutes "running" at 0% CPU on a build lock). Not while
    a rank waits in a collective or in init: the others' report names the idle one then (a rank
    missing from hvd.init() is idle too, and its report says more)."""
    if any(r.exit is None and r.blocked_since is not None for r in ranks):
        return None
    idle = [r for r in ranks if r.exit is None and r.state == "running"
            and r.blocked_since is None and getattr(r, "usage", None) is not None
            and r.usage.idle_since is not None and now - r.usage.idle_since >= stall_timeout]
    if not idle:
        return None
    they = len(idle) > 1
    return (f"stall: {ranks_text(idle)} {'have' if they else 'has'} used no CPU for "
            f"{now - min(r.usage.idle_since for r in idle):.0f} s, in no collective: "
            f"{'they wait' if they else 'it waits'} on something outside the ranks (a lock, a "
            f"file, the network, a subprocess, a sleep). Where each rank is:")


def _collective_message(ranks, stall_timeout, now):
    in_init = [r for r in ranks if r.exit is None and r.blocked_op in INIT_OPS
               and now - r.blocked_since >= init_stall_seconds(stall_timeout)]
    if in_init:
        return _init_message(ranks, in_init, now)
    waiting = [r for r in ranks if r.exit is None and r.blocked_since is not None
               and r.blocked_op not in INIT_OPS]
    elsewhere = [r for r in ranks if r not in waiting]
    if not any(now - r.blocked_since >= stall_timeout for r in waiting) or not elsewhere:
        return None  # nobody waits that long, or everybody waits (a slow collective, not a stall)
    ended = [r for r in elsewhere if r.exit is not None]
    starting = [r for r in elsewhere if r.exit is None and r.blocked_op in INIT_OPS]
    busy = [r for r in elsewhere if r.exit is None and r not in starting]
    why = []
    if ended:
        why.append(f"{ranks_text(ended)} ended")
    if starting:
        why.append(f"{ranks_text(starting)} {'are' if len(starting) > 1 else 'is'} still in "
                   f"{_init_names(starting)}")
    if busy:
        why.append(f"{ranks_text(busy)} {'are' if len(busy) > 1 else 'is'} running elsewhere")
    return (
        f"stall: {ranks_text(waiting)} {'have' if len(waiting) > 1 else 'has'} been waiting in a "
        f"collective ({_op_names(waiting)}) for "
        f"{now - min(r.blocked_since for r in waiting):.0f} s, while "
        f"{' and '.join(why)}: the waiting ranks are blocked on a collective (allreduce, "
        f"broadcast...) that the others never called, e.g. a loop that ran fewer steps on "
        f"some ranks. Where each rank is (run.stacks() asks again):")


def _op_names(ranks):
    return ", ".join(dict.fromkeys(r.blocked_op for r in ranks if r.blocked_op))


def _init_names(ranks):
    return " or ".join(dict.fromkeys(INIT_OPS[r.blocked_op] for r in ranks))


def _init_timeout(ranks):
    """Whose timeout ends a wait in init: JAX's (300 s by default) or Gloo's."""
    if all(r.blocked_op == "jax.distributed.initialize" for r in ranks):
        return "JAX's initialization timeout (300 s unless the cell passes another)"
    return "Gloo's timeout"


def _init_message(ranks, in_init, now):
    joined = [r for r in ranks if r.exit is None and r.blocked_op in INIT_OPS]
    missing = [r for r in ranks if r not in joined]
    waited = now - min(r.blocked_since for r in in_init)
    init = _init_names(joined)
    if not missing:
        return (f"stall: every rank has been in {init} for {waited:.0f} s and the Gloo "
                f"rendezvous has not completed: the ranks cannot reach rank 0's rendezvous server "
                f"or each other (check HOROVOD_GLOO_IFACE and firewalls between executors; "
                f"%horovod_env shows each executor's address). Where each rank is:")
    lines = [f"stall: {ranks_text(joined)} {'have' if len(joined) > 1 else 'has'} been waiting in "
             f"{init} for {waited:.0f} s for {ranks_text(missing)}, which "
             f"{'have' if len(missing) > 1 else 'has'} not called it. Every rank must call "
             f"{init} (not only some, e.g. behind `if` on the rank); the waiting ranks give "
             f"up only after {_init_timeout(joined)}."]
    for r in missing:
        if r.exit is not None:
            doing = "ended"
        elif r.pid is None:
            doing = "not started yet"
        else:
            doing = f"last line: {r.last_line.strip()}" if r.last_line.strip() else "no output yet"
        lines.append(f"  rank {r.rank}: {doing}")
    lines.append("Where each rank is:")
    return "\n".join(lines)
