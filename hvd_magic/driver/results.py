"""What the ranks sent back at the end, read in the notebook: each rank's value (with rank 0's
``--export`` names), the run's Horovod timeline or the ranks' torch profiles.

Reading them runs code of the ranks' making (a value's unpickling calls whatever its pickle
names), and the notebook may lack what the ranks had: a module, a class, a GPU. Whatever cannot
be read is kept as an `Unreadable` naming the rank, what it sent and why, and the run ends with a
`ResultError` (`unreadable_error`) rather than stopping half-way with its state "running". One
case is common enough to be read anyway: CUDA tensors returned to a notebook without a GPU come
back as CPU tensors (`compat.torch.storage_loader_on_cpu`), and the run says so once.

Values come back as Spark's own task results (or the local launcher's, or a warm session's
signed ones: `hvd_magic.launch.session`), never over the event channel.

Not for: how a rank's own failure is told (`hvd_magic.driver.ending`).
"""

import io
import os
import pickle
import traceback
from dataclasses import dataclass, field

from ..compat import torch as torch_compat
from ..errors import ResultError, describe_end, name_cells
from ..timelines.ranks import ProfileError
from ..words import plural

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hvd_magic's own frames


@dataclass
class Unreadable:
    """What rank `rank` sent that this notebook could not read."""
    rank: object                 # None: no one rank's (the merged profile could not be written)
    what: str                    # "value", "timeline", "profile"
    error: BaseException

    def info(self, run):
        """The `ResultError`'s info: its cause, where reading failed, what to do."""
        # (a profile's own cause where it has one: the JSON's error)
        cause = self.error.__cause__ or self.error if isinstance(self.error, ProfileError) \
            else self.error
        return {"rank": self.rank, "what": self.what, "type": type(cause).__name__,
                "message": str(cause), "traceback": _reading_frames(cause),
                "host": run.ranks[self.rank].host if self.rank is not None else None,
                "hint": _hint(self, cause, run)}


@dataclass
class Collected:
    """The launcher's ``(rank, status, payload)`` outcomes, read."""
    results: list
    exports: dict = field(default_factory=dict)
    infos: dict = field(default_factory=dict)       # rank -> how a rank that did not finish ended
    retried: object = None                          # Spark re-attempted the stage: its word
    unreadable: list = field(default_factory=list)  # `Unreadable` values, by rank
    on_cpu: list = field(default_factory=list)      # ranks whose CUDA tensors came back on the CPU


def collect(outcomes, np, cell):
    """The outcomes read into a `Collected` (`cell`: a cell's values carry its exports)."""
    import cloudpickle  # noqa: F401  (values may need it to unpickle)

    got = Collected([None] * np)
    for rank, status, payload in outcomes:
        if status == "retried":
            got.retried = payload
        elif status == "ok":
            reader = _ValueReader(io.BytesIO(payload))
            try:
                value = reader.load()
            except Exception as exc:  # anything a value's own unpickling raised, here: the
                # rank finished, the run must end all the same, naming it and the cause
                got.unreadable.append(Unreadable(rank, "value", exc))
                continue
            if reader.on_cpu:
                got.on_cpu.append(rank)
            if cell:
                value, rank_exports = value
                if rank_exports is not None:  # (only Horovod's rank 0 sends them: in an
                    # elastic run, not necessarily the view's rank 0)
                    got.exports = rank_exports
            got.results[rank] = value
        else:
            got.infos[rank] = dict(payload, status=status)
    return got


def on_cpu_message(ranks):
    """The one line said when CUDA tensors of `ranks`' values came back as CPU tensors."""
    whose = f"rank {ranks[0]}'s value" if len(ranks) == 1 else \
        f"the values of {plural(len(ranks), 'rank')} ({', '.join(map(str, ranks))})"
    return (f"{whose[0].upper()}{whose[1:]} held CUDA tensors, and this notebook has no GPU: "
            f"they came back as CPU tensors.")


def timeline_of(run):
    """(the run's timeline file or None, [the `Unreadable` it was] or []), once every rank ended: rank
    0's Horovod timeline, repaired, or every rank's torch profile, merged (`hvd_magic.timelines`)."""
    if run.folder.has_partial("timeline"):
        from ..timelines.trace import finalize
        try:
            return finalize(run.run_dir), []
        except OSError as exc:
            return None, [Unreadable(0, "timeline", exc)]  # (Horovod's is rank 0's alone)
    if run.profile:
        from ..timelines.ranks import merge
        try:
            return merge(run.run_dir, [r.clock for r in run.ranks],
                         [r.host for r in run.ranks]), []
        except ProfileError as exc:
            return None, [Unreadable(exc.rank, "profile", exc)]
        except (OSError, KeyError, TypeError, ValueError) as exc:  # writing the merged trace
            return None, [Unreadable(None, "profile", exc)]
    return run.timeline_path, []


def unreadable_error(run, unreadable):
    """The `ResultError` a run whose ranks all finished ends with when some of what they sent
    cannot be read here (the lowest rank's value first), or None."""
    if not unreadable:
        return None
    first, *rest = sorted(unreadable, key=lambda u: (u.what != "value", -1 if u.rank is None
                                                     else u.rank))
    others = {rank: "finished" for rank in range(run.np) if rank != first.rank}
    others.update({u.rank: f"its {u.what} could not be read either: "
                           f"{describe_end(u.info(run))}"
                   for u in rest if u.rank is not None and u.rank != first.rank})
    note = None
    if first.what != "value" and run.results is not None:
        note = "Every rank's value came back: hvd_magic.last_run().results."
    return ResultError(first.info(run), others, run_id=run.id, note=note)


class _ValueReader(pickle.Unpickler):
    """`pickle.Unpickler` that puts a CUDA tensor's storage on the CPU in a notebook without a
    GPU; `on_cpu`: whether it did."""

    on_cpu = False

    def find_class(self, module, name):
        found = super().find_class(module, name)
        if module.startswith("torch"):
            return torch_compat.storage_loader_on_cpu(module, name, self._moved) or found
        return found

    def _moved(self):
        self.on_cpu = True


def _reading_frames(error):
    """Where reading failed, from the first frame that is neither hvd_magic's nor the import
    system's (the value's own unpickling: its class's code, torch's), as a traceback's text;
    empty where there is none (a module not found: its message says it all)."""
    frames = traceback.extract_tb(error.__traceback__)
    theirs = [i for i, f in enumerate(frames)
              if not f.filename.startswith((_OURS, "<frozen importlib"))]
    if not theirs:
        return ""
    lines = traceback.format_list(frames[theirs[0]:])
    lines += traceback.format_exception_only(type(error), error)
    return name_cells("Traceback (most recent call last):\n" + "".join(lines))


def _hint(unreadable, cause, run):
    """What to do about it."""
    rank, what = unreadable.rank, unreadable.what
    if what != "value":
        return (f"What came back is in {run.run_dir}. The run's own values and logs are not "
                f"affected; run it again without --timeline to have no {what} read.")
    exports = getattr(run.cell, "export", ())
    sent = f"rank {rank}'s value" + (f" (or its --export {', '.join(exports)})" if exports and
                                     rank == 0 else "")
    if "CUDA" in str(cause) and "is_available() is False" in str(cause):
        return (f"{sent[0].upper()}{sent[1:]} holds CUDA tensors and this notebook has no GPU "
                "(and this torch's tensors could not be mapped to the CPU here): return them on "
                "the CPU from the cell: tensor.cpu(), model.cpu().state_dict(), "
                "{k: v.cpu() for k, v in d.items()}.")
    if isinstance(cause, (ImportError, AttributeError)):
        return (f"{sent[0].upper()}{sent[1:]} is of a class this notebook cannot import: a "
                "module (or a version of it) the ranks have and this Python lacks. Install it "
                "here, or return plain values (numbers, lists, dicts, NumPy arrays, CPU tensors) "
                "and build the object in the notebook.")
    return (f"Unpickling {sent} failed in this notebook (the traceback above is where). Return "
            "plain values (numbers, lists, dicts, NumPy arrays, CPU tensors) and build the "
            "object in the notebook.")
