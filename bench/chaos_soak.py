"""The long soak of bench/chaos.py (``--soak``): rounds played until a number of them counted
(their fault struck, or none), every launcher x program x fault pair the harness can play
drawn in turn, and resumable: each round is appended to one .jsonl.gz, and a soak started
again on that output skips the rounds it holds, so that a thousand rounds can be played over
sittings on one commit (a soak refuses an output of another commit: `chaos.COMMIT`, the last
commit of the code a round runs, so that outputs committed between sittings change nothing).

Round n of a soak plays pair n mod P of its cycle (P: the pairs; a cycle: P rounds), the
pairs of each cycle shuffled by the seed, then grouped by launcher (a Spark session is made
again only where the launcher changes: driver, spark, cluster, then back, so that cycles meet
on one launcher), a killed notebook's rounds last in each group; what else it draws (victim, moment, neighbour) is chaos.draw's for that round.
``--soak --seed S --only N`` plays round N again as the soak drew it."""

import os
import random
import sys

import chaos_table


def pairs(launchers, programs, faults, not_on):
    """The (launcher, program, fault) pairs the harness can play: no fault where its launcher
    has nothing to strike, and no killed notebook of a session (its end is the session's)."""
    return [(launcher, program, fault) for launcher in launchers for program in programs
            for fault in faults if fault not in not_on[launcher] and
            not (program == "session" and fault == "notebook")]


def pair_of(seed, number, played):
    """The pair of the soak's round `number` (`played`: the pairs, in the launchers' order)."""
    cycle, at = divmod(number, len(played))
    order = list(played)
    random.Random(f"{seed}:soak:{cycle}").shuffle(order)
    launchers = list(dict.fromkeys(p[0] for p in played))
    if cycle % 2:  # (the next cycle begins with the launcher the last one ended with)
        launchers.reverse()
    # (a killed notebook's rounds last of their launcher's: on the cluster, each lends the
    # cores of the soak's session, which the next round of another fault makes again)
    order.sort(key=lambda p: (launchers.index(p[0]), p[2] == "notebook"))
    return order[at]


def soak_round(chaos, seed, number, played, timeout, neighbours):
    launcher, program, fault = pair_of(seed, number, played)
    return dict(chaos.draw(seed, number, [launcher], [program], [fault], timeout, neighbours),
                plan="soak")


def held(path):
    """The rounds an output holds already: {(seed, round): outcome}."""
    if not path or not os.path.exists(path):
        return {}
    return {(o["seed"], o["round"]): o for o in chaos_table.outcomes_in(path)
            if o.get("plan") == "soak"}


def resumable(path, commit, seed):
    """Why output `path` cannot be resumed by this soak (None: it can): its rounds were played
    on another commit, or of another seed."""
    done = held(path)
    commits = {o.get("commit") for o in done.values()}
    seeds = {s for s, _ in done}
    if commits - {commit}:
        return (f"{path} holds rounds of commit(s) {sorted(commits - {commit})}, and this is "
                f"{commit}: a soak's rounds are all of one commit (start another output)")
    if seeds - {seed}:
        return f"{path} holds rounds of seed(s) {sorted(seeds)}: resume it with that seed"
    return None


def played_pairs(chaos, launchers, programs, faults, out=sys.stderr):
    """The pairs this machine plays (a fault it cannot play refused, and said so)."""
    why = chaos.refused(faults)
    for fault, reason in why.items():
        print(f"refused: the {fault} fault ({reason})", file=out, flush=True)
    return pairs(launchers, programs, [f for f in faults if f not in why], chaos.NOT_ON)


def soak(chaos, ip, seed, target, output, launchers, programs, faults, timeout, neighbours,
         minutes=None, out=sys.stderr):
    """Play the soak's rounds of `seed` not yet in `output` until `target` of them counted (or
    `minutes` passed); the outcomes played now."""
    import time
    played = played_pairs(chaos, launchers, programs, faults, out)
    done = held(output)
    counted = sum(chaos_table.counted(o) for o in done.values())
    print(f"soak: seed {seed}, {len(played)} pairs; {len(done)} rounds held already in "
          f"{output}, {counted} counted; playing until {target} counted", file=out, flush=True)
    outcomes, began, number = [], time.monotonic(), 0
    while counted < target:
        if minutes is not None and time.monotonic() - began > minutes * 60:
            break
        if (seed, number) not in done:
            outcome = chaos._played(ip, soak_round(chaos, seed, number, played, timeout,
                                                   neighbours), out, output)
            outcomes.append(outcome)
            counted += chaos_table.counted(outcome)
        number += 1
    chaos.finished()
    return outcomes
