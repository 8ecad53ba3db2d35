"""Elastic training for torch.distributed, shaped as Horovod's elastic API: a run that loses a
rank goes on with the survivors, in the same processes, from their last commit.

On a rank of a ``%%distributed --np 4 --min-np 2`` cell (or ``hvd_magic.run(fn, np=4,
min_np=2)``, a script's ``hvd-run --min-np``)::

    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from hvd_magic import elastic

    dist.init_process_group("gloo")
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = elastic.TorchState(model=model, optimizer=optimizer, step=0)

    @elastic.run
    def train(state):
        ddp = DDP(state.model)          # made here: it is bound to this world's group
        while state.step < 1000:
            ...  # forward, backward, optimizer.step() on the rank's batch for state.step
            state.step += 1
            if state.step % 10 == 0:
                state.commit()
        return state.step

    train(state)

When a rank is lost, the driver (`hvd_magic.launch.elastic.ddp`) forms a new world of the
survivors and tells them at once (`hvd_magic.rank.elastic_world`): a collective waiting on the
lost peer returns with an error, each survivor leaves its process group, makes the new one on a
new store, rolls back to its last commit, takes rank 0's state, calls the reset callbacks and
calls the function again. ``dist.get_world_size()``, ``RANK``, ``WORLD_SIZE`` are the new world's.
A replacement (or a rank beyond ``--np`` up to ``--max-np``) joins at the others' next commit.
Outside such a run `run` just calls the function (after one sync), so the same code runs on a
plain launch too.

Not for: who is in the world (the driver decides, `rank.elastic_world` carries it out).
"""

import copy
import functools

from .rank import elastic_world, stall

LOSS_WAIT = 30.0  # seconds a rank whose collective failed waits for the driver's new world


class WrongElasticWorld(RuntimeError):
    """`run` called in an elastic run of the other kind (Horovod's)."""


class MembershipChanged(RuntimeError):
    """Raised by `State.commit` when the driver formed a new world: `run` catches it."""


class State:
    """What a rank rolls back to and shares after a change of world: `commit` keeps a copy,
    `restore` goes back to it, `sync` gives every rank rank 0's."""

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Functions called with no argument after every change of world (rescale the learning
        rate to the new world size, rebuild what depends on it)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Keep the state as it is now; then, if the world changes, leave for the new one.
        Every rank commits at the same steps (as with Horovod's elastic State)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Leave for the driver's new world, all of this world's ranks together: one whose
        word from the driver is still on its way leaves with the others (a rank that went on
        alone would wait in the next step's collective for peers that left)."""
        here = elastic_world.world()
        if here is not None and _anyone(here.changed()):
            raise MembershipChanged("the driver formed a new world")

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError


class ObjectState(State):
    """Plain values as attributes (``state.epoch``), rank 0's shared by pickling."""

    def __init__(self, **values):
        super().__init__()
        self._names = list(values)
        for name, value in values.items():
            setattr(self, name, value)
        self.save()

    def _values(self):
        return {name: getattr(self, name) for name in self._names}

    def save(self):
        self._saved = copy.deepcopy(self._values())

    def restore(self):
        for name, value in copy.deepcopy(self._saved).items():
            setattr(self, name, value)

    def sync(self):
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return
        values = [self._values()]
        dist.broadcast_object_list(values, src=0)
        for name, value in values[0].items():
            setattr(self, name, value)
        self.save()


class TorchState(ObjectState):
    """A model and an optimizer (each optional) and plain values. The model is the plain
    module: wrap it in ``DistributedDataParallel`` inside the function `run` decorates, since
    the wrapper is bound to one process group."""

    def __init__(self, model=None, optimizer=None, **values):
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            raise ValueError(
                "TorchState(model=...) takes the plain module, not its DistributedDataParallel "
                "wrapper: the wrapper is bound to one process group, which a change of world "
                "replaces. Give it `ddp.module`, and make the DDP wrapper inside the function "
                "@elastic.run decorates (it is made again for each world).")
        self.model, self.optimizer = model, optimizer
        super().__init__(**values)

    def save(self):
        super().save()
        if self.model is not None:
            self._model = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        if self.optimizer is not None:
            self._optimizer = copy.deepcopy(self.optimizer.state_dict())

    def restore(self):
        super().restore()
        if self.model is not None:
            self.model.load_state_dict(self._model)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(copy.deepcopy(self._optimizer))

    def sync(self):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() > 1:
            if self.model is not None:
                for tensor in self.model.state_dict().values():
                    dist.broadcast(tensor, src=0)  # (in place: a state_dict shares the storage)
            if self.optimizer is not None:
                held = [self.optimizer.state_dict()]
                dist.broadcast_object_list(held, src=0)
                if dist.get_rank() != 0:
                    self.optimizer.load_state_dict(held[0])
        super().sync()  # the plain values, and a commit of it all


def run(fn):
    """Decorate the training function ``fn(state, ...)``: called again, in a new world, after
    every change of world (a rank lost, a rank joining), with `state` rolled back to its last
    commit and equal to rank 0's; its value is the last call's."""

    @functools.wraps(fn)
    def elastic_fn(state, *args, **kwargs):
        if elastic_world.horovod_elastic() and not elastic_world.active():
            raise WrongElasticWorld(
                "hvd_magic.elastic.run re-forms a torch.distributed world, and this rank is in "
                "Horovod's elastic run (its ring is Horovod's to re-form: the job was read as "
                "Horovod code). Use Horovod's own hvd.elastic.run and a hvd.elastic State here, "
                "or leave Horovod out of the job so that --min-np makes a torch.distributed "
                "elastic run (docs/elastic_ddp.md).")
        here = elastic_world.world()
        if here is None:  # not an elastic run: the same code runs once
            _group(None)
            state.sync()
            return fn(state, *args, **kwargs)
        backend = _group(here)
        changed = False
        while True:
            try:  # (a member lost while the state is shared: a newer world, as in the call)
                state.sync()
                if changed:
                    state.on_reset()
                return fn(state, *args, **kwargs)
            except MembershipChanged:
                pass  # committed just now: nothing to roll back
            except Exception as exc:
                if not _lost_peer(here, exc):
                    raise
                state.restore()
            here.form(backend)
            changed = True

    return elastic_fn


def _anyone(flag):
    """Whether `flag` holds on any rank of the current group (its ranks call this together)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    nccl = dist.get_backend() == "nccl"
    held = torch.tensor([int(flag)], device=torch.cuda.current_device() if nccl else "cpu")
    dist.all_reduce(held, op=dist.ReduceOp.MAX)
    return bool(held.item())


def _group(here):
    """The default process group (made from the run's variables if the code has not made it):
    its backend."""
    import torch.distributed as dist

    if not dist.is_initialized():
        import torch
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_backend()


def _lost_peer(here, exc):
    """After a call that raised `exc`: whether it failed because the world changed (the
    driver's word came, or comes within `LOSS_WAIT` seconds for what a collective raises when a
    peer is gone), not because of the code, whose error is the run's at once: the code's own
    socket that broke as a peer was lost too (`stall.code_error`: by cause, not by words)."""
    if stall.code_error(exc):
        return False
    return here.troubled(LOSS_WAIT if _collective_failure(exc) else 0)


_TRANSPORT_WORDS = ("gloo", "nccl", "connection", "socket", "timed out", "timeout", "peer")


def _collective_failure(exc):
    """What a collective raises when a peer went away (torch's `DistError`, or a RuntimeError
    from Gloo's or NCCL's transport)."""
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(word in text for word in _TRANSPORT_WORDS)
