"""Every rank's torch profile (``--timeline`` of torch code without Horovod) as one trace, the
clocks aligned, and what it says: where each step's time went on each rank, and which rank the
others waited for at each collective.

- clocks: when every task has connected, the driver asks each for its host's time a few
  times (`ask_clocks`); the answer with the shortest round trip gives the host's offset to the
  notebook's clock, within half that round trip (`heard_clock`). Where the same collective ends
  on two ranks (Gloo and NCCL end an all-reduce together), the median of their end times refines
  the offset, kept within what the handshake allows;
- `merge`: the ranks' files (`hvd_magic.rank.profile`, in ``profile/rank-<k>/trace.json``) as one
  gzipped Chrome/Perfetto trace, ``timeline-ranks.json.gz``: a process per rank named
  "rank k (host)" with its threads as tracks and a "steps" track, times in microseconds from the
  first event, each rank's offset and its uncertainty in ``hvd_magic.ranks`` (and in the
  process's name labels);
- `RanksTimeline`: read back, with the table per step and rank (step time, time inside
  collectives, time waiting for the last rank to arrive) and a one-line verdict.

Not for: Horovod's timeline (`trace`, rank 0's only), or drawing (`ranks_picture`).
"""

import gzip
import json
import os
import statistics
import threading
import time

from .trace import _union

FILE_NAME = "timeline-ranks.json.gz"
PINGS = 5              # clock questions to each task
PING_EVERY = 0.02      # seconds between them
_COLLECTIVE_PREFIXES = ("gloo:", "nccl:")  # torch's; TensorFlow's: "<name>:Collective<op>",
# JAX's "<XLA op>:<collective>" (their `cat` says so)


# -- clocks ---------------------------------------------------------------------------------------
def ask_clocks(server, pings=PINGS, every=PING_EVERY):
    """Ask every task for its host's time, `pings` times (in the background)."""
    def ask():
        for i in range(pings):
            server.broadcast({"t": "clock", "id": i, "sent": time.time()})
            time.sleep(every)

    threading.Thread(target=ask, name="hvd-magic-clocks", daemon=True).start()


def heard_clock(rank_state, event, now=None):
    """A task's answer: the rank's (offset, uncertainty) in seconds, the best answer kept."""
    now = time.time() if now is None else now
    sent, here = event.get("sent"), event.get("here")
    if not isinstance(sent, (int, float)) or not isinstance(here, (int, float)) or now < sent:
        return
    half = (now - sent) / 2
    if rank_state.clock is None or half < rank_state.clock[1]:
        rank_state.clock = (here - (sent + now) / 2, half)


# -- merging --------------------------------------------------------------------------------------
def _collectives(events):
    """name -> [(start, end)] of the collectives in a rank's events, in order of start."""
    found = {}
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and (name.startswith(_COLLECTIVE_PREFIXES)
                                   or e.get("cat") in ("tf_collective", "jax_collective")):
            found.setdefault(name, []).append((e["ts"], e["ts"] + e.get("dur", 0)))
    return {name: sorted(spans) for name, spans in found.items()}


def _refined(offsets, collectives):
    """Each rank's offset (µs) moved to where its collectives end with rank 0's (the median of
    the differences), within its handshake uncertainty (None: unknown, any move)."""
    refined = dict(offsets)
    base = collectives.get(0, {})
    for rank, spans in collectives.items():
        if rank == 0 or rank not in offsets:
            continue
        diffs = [(mine[1] - offsets[rank][0]) - (theirs[1] - offsets[0][0])
                 for name, ours in spans.items()
                 for mine, theirs in zip(ours, base.get(name, ()))]
        if len(diffs) < 3:
            continue
        move, (offset, uncertainty) = statistics.median(diffs), offsets[rank]
        if uncertainty is not None:
            move = max(-uncertainty, min(uncertainty, move))
        refined[rank] = (offset + move, uncertainty)
    return refined


class ProfileError(ValueError):
    """A rank's profile came back but cannot be read (`.rank`): the run says so, naming it."""

    def __init__(self, rank, cause):
        super().__init__(cause)
        self.rank = rank


def _profile(path, rank):
    """Rank `rank`'s profile as `rank.profile` wrote it, checked; None if it sent none or its
    window recorded nothing (a run that ended before the profiled steps)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # (the rank writes it whole: a bad one is no cut-off)
        raise ProfileError(rank, f"{type(exc).__name__}: {exc}") from exc
    if not _is_profile(record):
        raise ProfileError(rank, f"{path} is not a profile as hvd_magic writes one (timed "
                                 f"events, steps)")
    if not record["steps"] and not any("ts" in e for e in record["events"]):
        return None
    return record


def _is_profile(record):
    number = (int, float)
    return isinstance(record, dict) and isinstance(record.get("events"), list) and \
        isinstance(record.get("steps"), list) and isinstance(record.get("skip", 0), int) and \
        all(isinstance(e, dict) and isinstance(e.get("ts", 0), number) for e in record["events"]) \
        and all(isinstance(s, number) for s in record["steps"])


def unstarted(run_dir, np):
    """{rank: why its profiler could not start} of the ranks that said so in their record."""
    why = {}
    for rank in range(np):
        try:
            with open(os.path.join(run_dir, "profile", f"rank-{rank}", "trace.json"),
                      encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("unstarted"):
            why[rank] = str(record["unstarted"])
    return why


def nothing_recorded(plan, run_dir=None, np=0):
    """What a ``--timeline`` run of `plan` (`hvd_magic.api.profile_plan`) whose ranks recorded
    nothing says: why the profiler could not start where a rank said so, else the steps its
    window waited for, and what counts as a step."""
    why = unstarted(run_dir, np) if run_dir else {}
    if why:
        ranks = ", ".join(str(rank) for rank in sorted(why))
        return (f"--timeline recorded nothing: the profiler could not start on rank(s) {ranks} "
                f"({why[min(why)]}). A job that runs the profiler itself (jax.profiler.trace, "
                f"torch.profiler.profile) records its own: drop --timeline.")
    first, last = plan["skip"] + 1, plan["skip"] + plan["steps"]
    counted = ("a Keras training batch, or a `hvd_magic.report(step=...)` call"
               if plan["framework"] == "tensorflow" else
               "a `hvd_magic.report(step=...)` call (JAX has no optimizer or fit to count: "
               "report each step of the loop)" if plan["framework"] == "jax" else
               "an optimizer's `step()` (DDP, Lightning and accelerate call one), or in a loop "
               "without one a `hvd_magic.report(step=...)` call")
    return (f"--timeline recorded nothing: its window is steps {first} to {last} and no rank "
            f"reached step {first}. A step is {counted}; a shorter run needs an earlier "
            f"window (--timeline-steps 2:3). Horovod code records its whole run, or a window "
            f"with `with hvd_magic.timeline():`.")


def merge(run_dir, clocks, hosts=None):
    """The ranks' profiles under `run_dir`/profile as one trace file; its path (None if no rank
    sent one). `clocks`: each rank's (offset, uncertainty) in seconds, or None; `hosts`: each
    rank's host as the run's view names it (default: as the rank named it). A profile that came
    back and cannot be read raises `ProfileError`, naming its rank."""
    ranks = {}
    for rank in range(len(clocks)):
        record = _profile(os.path.join(run_dir, "profile", f"rank-{rank}", "trace.json"), rank)
        if record is not None:
            ranks[rank] = record
    if not ranks:
        return None
    offsets = {rank: (clocks[rank][0] * 1e6, clocks[rank][1] * 1e6) if clocks[rank] else (0.0, None)
               for rank in ranks}
    offsets = _refined(offsets, {rank: _collectives(r["events"]) for rank, r in ranks.items()})
    t0 = min(e["ts"] - offsets[rank][0] for rank, r in ranks.items()
             for e in r["events"] + [{"ts": s} for s in r["steps"]] if "ts" in e)
    events, about = [], []
    for rank, record in sorted(ranks.items()):
        if hosts and hosts[rank]:
            record["host"] = hosts[rank]
        offset, uncertainty = offsets[rank]
        shift = offset + t0
        name = f"rank {rank} ({record.get('host', '?')})"
        events += [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                    "args": {"name": name}},
                   {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                    "args": {"sort_index": rank}},
                   {"ph": "M", "name": "thread_name", "pid": rank, "tid": "steps",
                    "args": {"name": "steps"}}]
        for e in record["events"]:
            if e.get("ph") == "M" and e.get("name") in ("process_name", "process_labels",
                                                         "process_sort_index"):
                continue
            e = dict(e, pid=rank)
            if "ts" in e:
                e["ts"] = round(e["ts"] - shift, 3)
            events.append(e)
        marks = record["steps"]
        first = record.get("skip", 0) + 1
        events += [{"ph": "X", "name": f"step {first + i}", "cat": "hvd_magic.step", "pid": rank,
                    "tid": "steps", "ts": round(a - shift, 3), "dur": round(b - a, 3)}
                   for i, (a, b) in enumerate(zip(marks, marks[1:]))]
        about.append({"rank": rank, "host": record.get("host"), "offset_us": round(offset, 1),
                      "uncertainty_us": None if uncertainty is None else round(uncertainty, 1),
                      "cut_events": record.get("cut", 0), "first_step": first,
                      "steps": [round(m - shift, 3) for m in marks]})
    path = os.path.join(run_dir, FILE_NAME)
    with gzip.open(path + ".part", "wt", encoding="utf-8") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                   "hvd_magic": {"ranks": about, "t0_us": t0,
                                 "framework": ranks[min(ranks)].get("framework", "torch")}},
                  f, separators=(",", ":"))
    os.replace(path + ".part", path)
    return path


# -- reading --------------------------------------------------------------------------------------
class RanksTimeline:
    """A merged trace (`merge`), read: `steps` per rank ([(start, end)] in µs from the trace's
    start), `collectives` ([(name, {rank: (start, end)})], each matched across the ranks by its
    order among its name's), the ranks' clock facts (`ranks`)."""

    def __init__(self, trace):
        self.ranks = trace["hvd_magic"]["ranks"]
        self.framework = trace["hvd_magic"].get("framework", "torch")  # whose profiler
        events = trace["traceEvents"]
        self.steps = {r["rank"]: list(zip(r["steps"], r["steps"][1:])) for r in self.ranks}
        self.first_step = min((r["first_step"] for r in self.ranks), default=1)
        by_rank = {}
        for e in events:
            if isinstance(e.get("pid"), int):
                by_rank.setdefault(e["pid"], []).append(e)
        spans = {rank: _collectives(evs) for rank, evs in by_rank.items()}
        self.collectives = []
        names = sorted({n for per in spans.values() for n in per})
        for name in names:
            count = min(len(per.get(name, ())) for per in spans.values())
            for i in range(count):
                self.collectives.append((name, {rank: per[name][i] for rank, per in spans.items()}))
        self.collectives.sort(key=lambda c: min(s for s, _ in c[1].values()))

    @classmethod
    def load(cls, path):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return cls(json.load(f))

    def waits(self):
        """[(name, last rank, {rank: µs it waited for the last to arrive}, spans)] for each
        collective that more than one rank recorded."""
        out = []
        for name, spans in self.collectives:
            if len(spans) < 2:
                continue
            last = max(spans, key=lambda r: spans[r][0])
            arrived = spans[last][0]
            out.append((name, last, {r: arrived - s for r, (s, _) in spans.items() if r != last},
                        spans))
        return out

    def table(self):
        """[{step, rank, step_us, collective_us, waiting_us}] per profiled step and rank:
        the step's time, its time inside collectives, and how long the rank waited in them
        for the last rank to arrive."""
        waits = self.waits()
        rows = []
        for rank, steps in sorted(self.steps.items()):
            mine = sorted(spans[rank] for _, spans in self.collectives if rank in spans)
            for i, (a, b) in enumerate(steps):
                inside = _union([(max(s, a), min(e, b)) for s, e in mine if s < b and e > a])
                waited = sum(w[rank] for _, _, w, spans in waits
                             if rank in w and a <= spans[rank][0] < b)
                rows.append({"step": self.first_step + i, "rank": rank, "step_us": b - a,
                             "collective_us": inside, "waiting_us": waited})
        return rows

    def verdict(self):
        """One line: the rank the others waited on longest, in all, and what it cost them. (Not
        the rank last most often: of a step's collectives only the first carries a slow rank's
        delay, the rest start together and their last is the noise of a few µs.)"""
        waits = self.waits()
        if not waits:
            return "no collective was recorded in the profiled steps"
        counts, cost = {}, {}
        for _, last, w, _ in waits:
            counts[last] = counts.get(last, 0) + 1
            cost[last] = cost.get(last, 0) + statistics.mean(w.values())
        worst = max(cost, key=cost.get)
        steps = max(1, max((len(s) for s in self.steps.values()), default=1))
        kinds = sorted({name.split(":", 1)[1] for name, *_ in waits})
        return (f"rank {worst} arrived last at {counts[worst]} of {len(waits)} collectives "
                f"({', '.join(kinds)}); the others waited {cost[worst] / steps / 1000:.1f} ms "
                f"a step on it")

