"""An elastic run's member that is alive but makes no progress (a process SIGSTOPped, a
deadlock, a hung call that uses no CPU): given up after a stated time, so the others go on.

Nothing in the ranks can tell: Gloo's connections to a stopped process stay open and its peers
wait in the collective for the framework's timeout (Gloo's 30 minutes, or the run's
``--timeout``). Here the driver compares what it already hears of every rank: once some
ranks have waited in a collective (`hvd_magic.rank.stall`'s ``blocked``) for
``--frozen-timeout`` seconds (`DEFAULT_TIMEOUT` unless given), a member that is not in that
wait and whose process tree used no CPU all that time (its task's ``resources`` samples, every
second: at most `IDLE_CPU` % of one core each) is declared lost: its task kills its process
group (SIGKILL), and the launcher goes on as after any loss (the survivors re-form, a
replacement joins later). A rank that computes on its own while the others wait uses CPU and
is left alone; one that waits on something outside the run (a slow disk, a lock) uses none and
is given up too: a longer timeout is the way to allow it. Once every other member has ended,
nobody waits in a collective, yet the run waits for the one left: a member that used no CPU
for ``--frozen-timeout`` seconds then (stopped before it ever joined a ring) is given up too.

Not for: the hang watchdog's report (ranks waiting in a collective that others never call:
`hvd_magic.driver.watchdog`), or the loss itself (`hvd_magic.driver.membership`).
"""

import time

from .ranks import ranks_text

DEFAULT_TIMEOUT = 120.0  # seconds (``--frozen-timeout``)
IDLE_CPU = 5.0           # % of one core: a process tree at most this busy does not run


def frozen(ranks, timeout, waited, now=None, wall=None):
    """(the ranks that have waited in a collective for `timeout` seconds, the members that made
    no progress meanwhile): `ranks` are the members now (not the lost ones), RankStates;
    `waited`: {rank: when it was last seen waiting (monotonic)}. A rank that waited itself
    within `timeout` (its CPU idle for that) is not frozen: its wait just ended (the word of
    its end may come before a peer's)."""
    now = time.monotonic() if now is None else now
    wall = time.time() if wall is None else wall
    live = [r for r in ranks if r.exit is None and r.pid is not None]
    waiting = [r for r in live if r.blocked_since is not None
               and now - r.blocked_since >= timeout]
    if not waiting:
        return [], []
    return waiting, [r for r in live if r.blocked_since is None
                     and now - waited.get(r.rank, float("-inf")) >= timeout
                     and idle(r.usage.points, timeout, wall)]


def left_behind(ranks, timeout, wall=None):
    """The members the run still waits for once others have ended, every one of them idle for
    `timeout` seconds (`ranks`: the members now, not the lost ones; a member in ``init`` too:
    with the others gone, nobody will form a ring with it)."""
    wall = time.time() if wall is None else wall
    live = [r for r in ranks if r.exit is None and r.pid is not None]
    if not any(r.exit is not None for r in ranks) or \
            not all(idle(r.usage.points, timeout, wall) for r in live):
        return []
    return live


def idle(points, timeout, wall):
    """Whether the samples of the last `timeout` seconds (``Usage.points``: unix time, cpu %,
    ...) cover them and say the process tree did not run."""
    recent = [(t, cpu) for t, cpu, *_ in points if t >= wall - timeout]
    return len(recent) >= 2 and recent[0][0] <= wall - timeout / 2 and \
        all(cpu <= IDLE_CPU for _, cpu in recent)


def how(waiting, timeout):
    """How a member given up was lost, in words (the membership's ``lost`` line)."""
    if not waiting:
        return (f"frozen: it used no CPU for {timeout:g} s (--frozen-timeout) while every other "
                f"member had ended, so it was killed (SIGKILL)")
    ops = ", ".join(dict.fromkeys(r.blocked_op for r in waiting if r.blocked_op))
    return (f"frozen: it used no CPU and was not in the collective ({ops}) that "
            f"{ranks_text(waiting)} waited in for {timeout:g} s (--frozen-timeout), so it was "
            f"killed (SIGKILL)")
