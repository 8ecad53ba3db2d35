"""The hang watchdog, driver side: some ranks wait in a collective that the others never call.

Horovod never notices a rank that stopped calling collectives (its stall inspector does not run
with Gloo): some ranks finished, or are busy elsewhere, while the others wait forever. The ranks
report waits longer than a few seconds (`hvd_magic.rank.stall`); this compares them.
"""

import time

from .ranks import ranks_text


def stall_message(ranks, stall_timeout, now=None):
    """The watchdog's message when ranks have waited `stall_timeout` s while others did not."""
    now = time.monotonic() if now is None else now
    waiting = [r for r in ranks if r.exit is None and r.blocked_since is not None
               and now - r.blocked_since >= stall_timeout]
    elsewhere = [r for r in ranks if r.exit is not None or r.blocked_since is None]
    if not waiting or not elsewhere:
        return None  # nobody waits that long, or everybody waits (a slow collective, not a stall)
    ended = [r for r in elsewhere if r.exit is not None]
    busy = [r for r in elsewhere if r.exit is None]
    why = []
    if ended:
        why.append(f"{ranks_text(ended)} ended")
    if busy:
        why.append(f"{ranks_text(busy)} {'are' if len(busy) > 1 else 'is'} running elsewhere")
    return (
        f"stall: {ranks_text(waiting)} {'have' if len(waiting) > 1 else 'has'} been waiting in a "
        f"collective for {now - min(r.blocked_since for r in waiting):.0f} s, while "
        f"{' and '.join(why)}: the waiting ranks are blocked on a collective (allreduce, "
        f"broadcast...) that the others never called, e.g. a loop that ran fewer steps on "
        f"some ranks. The Python stack of every rank is in its log.")
