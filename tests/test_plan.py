"""The slot plan is our own code (Horovod is optional) and numbers ranks as Horovod does: the same
slots as Horovod's own `get_host_assignments` for any hosts, where Horovod is installed."""

import pytest
from hypothesis import given, settings, strategies as st

from hvd_magic.task.plan import host_plan

# a task's host per partition: hosts repeat, in any order
partitions = st.lists(st.sampled_from(["10.0.0.1", "10.0.0.2", "b", "node-3", "10.0.0.5"]),
                      min_size=1, max_size=24)


def horovods_plan(hosts):
    """Horovod's slots for the same tasks, one per partition (what task/plan.py did before)."""
    hosts_util = pytest.importorskip("horovod.runner.common.util.hosts")
    order = list(dict.fromkeys(hosts))
    plan = hosts_util.get_host_assignments(
        hosts_util.parse_hosts(",".join(f"{h}:{hosts.count(h)}" for h in order)), len(hosts))
    taken = {h: iter([s for s in plan if s.hostname == h]) for h in order}
    return plan, [next(taken[h]) for h in hosts]


def fields(slot):
    return (slot.hostname, slot.rank, slot.local_rank, slot.cross_rank, slot.size,
            slot.local_size, slot.cross_size)


@settings(max_examples=300, deadline=None)
@given(partitions)
def test_the_plan_is_horovods(hosts):
    ours, theirs = host_plan(hosts), horovods_plan(hosts)
    assert [fields(s) for s in ours[0]] == [fields(s) for s in theirs[0]]
    assert [fields(s) for s in ours[1]] == [fields(s) for s in theirs[1]]


def test_uneven_hosts_by_hand():
    # partitions on a, b, a, c, a: a's three ranks first (0-2), then b's, then c's
    plan, slots = host_plan(["a", "b", "a", "c", "a"])
    assert [fields(s) for s in slots] == [
        ("a", 0, 0, 0, 5, 3, 3), ("b", 3, 0, 1, 5, 1, 3), ("a", 1, 1, 0, 5, 3, 1),
        ("c", 4, 0, 2, 5, 1, 3), ("a", 2, 2, 0, 5, 3, 1)]
    assert [s.rank for s in plan] == [0, 1, 2, 3, 4]
