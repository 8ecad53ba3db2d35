"""Issue 68: one reading of what a job needs (`hvd_magic.capture.reading`), from its code, never
its text: what it imports and which elastic API it uses decide the launch.

The runs are real (`--np -2 --min-np 2`, torch.distributed over Gloo); what would have gone
wrong before is a function or a shipped module that mentions Horovod in a string, a docstring or
a comment being launched as a Horovod elastic run, whose ranks then failed in torch's env://
rendezvous with no word of why.
"""

import os
import sys
import types

import cloudpickle
import pytest
from IPython.core.error import UsageError

import hvd_magic
from hvd_magic import elastic
from hvd_magic.capture.reading import read_job, source_of
from hvd_magic.view import TextView

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this module


def ddp_elastic_train(steps=6):
    """An elastic DDP loop with hvd_magic.elastic. It holds the string "horovod" (a log's
    label): strings say nothing of what the code uses."""
    import torch
    import torch.distributed as dist
    from hvd_magic import elastic as el

    label = "horovod"  # noqa: F841  (the string of the issue's example)
    dist.init_process_group("gloo")
    model = torch.nn.Linear(2, 1)
    state = el.TorchState(model=model, step=0)

    @el.run
    def train(state):
        while state.step < steps:
            dist.all_reduce(torch.ones(1))
            state.step += 1
            state.commit()
        return os.environ.get("HVD_MAGIC_ELASTIC"), dist.get_world_size(), state.step

    return train(state)


def horovod_elastic_train():
    import horovod.torch as hvd
    hvd.init()

    @hvd.elastic.run
    def train(state):
        return hvd.size()
    return train


def uses_both():
    import horovod.torch as hvd
    return hvd.elastic.run, elastic.run  # (elastic: this module's global, hvd_magic.elastic)


def calls_a_notebook_function():
    return ddp_elastic_train()


@pytest.mark.parametrize("fn, horovod, horovod_elastic, ours", [
    (ddp_elastic_train, False, False, True),          # "horovod" in a string, not in code
    (horovod_elastic_train, True, True, False),       # hvd.elastic.run through an alias
    (uses_both, True, True, True),
    (calls_a_notebook_function, False, False, True),  # through the function it calls
])
def test_a_functions_code_is_read_not_its_strings(fn, horovod, horovod_elastic, ours):
    reading = read_job(fn)
    assert (reading.horovod, reading.horovod_elastic, reading.ours_elastic) == \
        (horovod, horovod_elastic, ours), sorted(reading.names)


HELPER = '''\
"""Training helpers. Written for horovod first (import horovod.torch as hvd), now DDP."""
# hvd.elastic.run was here
from hvd_magic import elastic
'''


def test_a_shipped_modules_docstring_and_comments_say_nothing():
    reading = read_job(sources={"helpers.py": HELPER, "notes.txt": "not python: horovod"})
    assert not reading.horovod and reading.ours_elastic
    assert "hvd_magic.elastic" in reading.imports and "horovod" not in reading.imports
    text = read_job(sources={"t.py": "import horovod.torch.elastic\n"})
    assert text.horovod_elastic


def test_an_elastic_ddp_function_holding_the_string_horovod_runs_as_ours():
    """The issue's example: the string made it a Horovod elastic run; every rank then failed in
    2 s with "environment variable RANK expected, but not set"."""
    run = hvd_magic.run(ddp_elastic_train, np=-2, min_np=2, view=TextView(quiet=True))
    assert run.results == [("torch", 2, 6), ("torch", 2, 6)]


def test_a_cell_using_a_helper_module_that_mentions_horovod_runs_as_ours(ip, tmp_path,
                                                                         monkeypatch):
    (tmp_path / "helpers68.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    ip.run_cell("import helpers68")  # (the notebook's own module, beside it: shipped)
    cell = ("import os\nimport torch, torch.distributed as dist\n"
            "dist.init_process_group('gloo')\n"
            "state = helpers68.elastic.ObjectState(step=0)\n"
            "@helpers68.elastic.run\ndef go(state):\n    return os.environ.get('HVD_MAGIC_ELASTIC')\n"
            "go(state)\n")
    assert ip.run_cell_magic("distributed", "--np -2 --min-np 2 --quiet", cell) == "torch"


def test_two_elastic_apis_in_one_job_are_refused_before_anything_starts(ip):
    before = len(hvd_magic.runs())
    with pytest.raises(UsageError, match="two elastic APIs, Horovod's .* and hvd_magic.elastic"):
        hvd_magic.run(uses_both, np=-2, min_np=2)
    assert len(hvd_magic.runs()) == before


def test_ours_in_horovods_elastic_world_says_so(monkeypatch):
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    monkeypatch.delenv("HVD_MAGIC_ELASTIC", raising=False)
    with pytest.raises(elastic.WrongElasticWorld, match="this rank is in Horovod's elastic run"):
        elastic.run(lambda state: None)(elastic.ObjectState())


# Code whose source is nowhere (compiled from a string): its bytecode is all there is. Two
# locals loaded one after the other are one fused instruction from Python 3.13
# (LOAD_FAST_LOAD_FAST, its argument the pair of names), then `.elastic.run` on the second.
NO_SOURCE = """\
def train(model, hvd):
    return wrap(model, hvd.elastic.run)
"""


def test_bytecode_without_source_is_read_by_opcode_family_on_every_python():
    namespace = {}
    exec(compile(NO_SOURCE, "<no source>", "exec"), namespace)
    train = namespace["train"]
    assert source_of(train.__code__) is None  # (so the bytecode is read)
    reading = read_job(train, {"model": 1, "hvd": types.ModuleType("horovod.torch")})
    assert "horovod.torch.elastic.run" in reading.names and reading.horovod_elastic, \
        sorted(reading.names)


def test_a_functions_def_is_read_from_its_source():
    node = source_of(horovod_elastic_train.__code__)
    assert node.name == "horovod_elastic_train" and node.lineno > 1
