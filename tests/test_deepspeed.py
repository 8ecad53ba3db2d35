"""DeepSpeed in a %%horovod cell: ``deepspeed.initialize(model=..., config=...)`` unchanged on
CPU ranks (Gloo, DS_ACCELERATOR=cpu, torchrun's variables), ZeRO stages 0-3 ending with the
weights one process gets on the whole batches; a ZeRO checkpoint saved and loaded; its C++ op
built once per host (`hvd_magic.rank.deepspeed_setup`), a build lock left by a dead builder
cleared; real ranks, real DeepSpeed.

The first DeepSpeed rank on a machine whose op folder is empty compiles DeepSpeed's
shared-memory op (~3 minutes here): `make setup` prebuilds it (python -m hvd_magic.prebuild
deepspeed), else the first test here pays it once.
"""

import subprocess
import sys

import numpy as np
import pytest

import hvd_magic

pytest.importorskip("deepspeed", reason="make setup installs DeepSpeed (the deepspeed extra)")

STEPS, BATCH, LR = 3, 4, 0.1

# Each rank's micro-batches are its rows of the global batch; DeepSpeed averages gradients over
# the ranks, so each step is one SGD step on the whole batch's mean loss.
DS_CELL = """\
import os
import torch, deepspeed
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
          "gradient_clipping": 0.0, "zero_optimization": {"stage": STAGE},
          "zero_allow_untested_optimizer": True}  # (torch.optim.SGD)
engine, *_ = deepspeed.initialize(model=model, config=config,
                                  optimizer=torch.optim.SGD(model.parameters(), lr=LR))
g = torch.Generator().manual_seed(1)
x, y = torch.randn(STEPS, 2 * BATCH, 4, generator=g), torch.randn(STEPS, 2 * BATCH, 1, generator=g)
rank = int(os.environ["RANK"])
losses = []
for step in range(STEPS):
    rows = slice(rank * BATCH, (rank + 1) * BATCH)
    loss = torch.nn.functional.mse_loss(engine(x[step, rows]), y[step, rows])
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
"""
WEIGHTS = """\
if STAGE == 3:
    from deepspeed.utils import safe_get_full_fp32_param
    weights = [safe_get_full_fp32_param(p).tolist() for p in engine.module.parameters()]
else:
    weights = [p.detach().tolist() for p in engine.module.parameters()]
"""


def one_process():
    """The losses (each rank's half of each batch) and final weights of one process on the
    whole batches."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(STEPS, 2 * BATCH, 4, generator=g), torch.randn(STEPS, 2 * BATCH, 1, generator=g)
    losses = [[], []]
    for step in range(STEPS):
        out = model(x[step])
        for r in range(2):
            rows = slice(r * BATCH, (r + 1) * BATCH)
            losses[r].append(torch.nn.functional.mse_loss(out[rows], y[step, rows]).item())
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(out, y[step]).backward()
        optimizer.step()
    return losses, [p.detach().numpy() for p in model.parameters()]


def cell(stage, tail):
    return (DS_CELL.replace("STAGE", str(stage)).replace("BATCH", str(BATCH))
            .replace("STEPS", str(STEPS)).replace("LR", str(LR)) + tail)


def assert_as_one_process(results):
    losses, weights = one_process()
    for rank, (got_losses, got_weights) in enumerate(results):
        np.testing.assert_allclose(got_losses, losses[rank], rtol=1e-5, atol=1e-6)
        for got, want in zip(got_weights, weights):
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)


# (ZeRO-2 on the driver: the checkpoint test below trains it, and asserts the same of it)
@pytest.mark.parametrize("line, stage", [("--np -2", 0), ("--np -2", 1), ("--np -2", 3),
                                         ("--np 2", 2)])
def test_deepspeed_zero_trains_as_one_process_on_the_whole_batches(ip, line, stage):
    ip.run_cell_magic("horovod", f"{line} --quiet",
                      cell(stage, WEIGHTS.replace("STAGE", str(stage)) + "(losses, weights)\n"))
    run = hvd_magic.last_run()
    assert_as_one_process(run.results)
    assert [r.step for r in run.ranks] == [STEPS, STEPS]  # engine.step() is the progress


def test_a_deepspeed_checkpoint_is_saved_and_loaded_where_the_cell_says(ip, tmp_path):
    """ZeRO-2 on the driver trains as one process would (the stage the test above leaves to this
    one), saves after training; a fresh engine (other seed) loads it back and holds the trained
    weights, on every rank."""
    folder = tmp_path / "ckpt"
    tail = (WEIGHTS.replace("STAGE", "2")
            + f"engine.save_checkpoint({str(folder)!r}, tag='end')\n"
            "torch.manual_seed(7)\n"
            "fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), "
            "torch.nn.Linear(8, 1))\n"
            "again, *_ = deepspeed.initialize(model=fresh, config=config, "
            "optimizer=torch.optim.SGD(fresh.parameters(), lr=0.1))\n"
            f"again.load_checkpoint({str(folder)!r}, tag='end')\n"
            "loaded = [p.detach().tolist() for p in again.module.parameters()]\n"
            "(losses, weights, loaded)\n")
    ip.run_cell_magic("horovod", "--np -2 --quiet", cell(2, tail))
    run = hvd_magic.last_run()
    results = run.results
    assert_as_one_process([(losses, weights) for losses, weights, _ in results])
    assert [r.step for r in run.ranks] == [STEPS, STEPS]  # engine.step() is the progress
    for _, weights, loaded in results:
        for w, l in zip(weights, loaded):
            np.testing.assert_array_equal(np.asarray(w), np.asarray(l))
    assert (folder / "end").is_dir() and (folder / "latest").read_text() == "end"


def test_a_checkpoint_saved_to_a_relative_folder_outlives_the_run_and_loads_in_the_next(
        ip, tmp_path, monkeypatch):
    """A relative folder is the notebook's (the ranks' working directory on its host), not a
    rank's temporary folder removed at its end: ZeRO-2 saves to "ckpt",
    the folder is there after the run, and a second run's fresh engine loads it from there."""
    monkeypatch.chdir(tmp_path)  # (the notebook's folder)
    save = WEIGHTS.replace("STAGE", "2") + ("engine.save_checkpoint('ckpt', tag='end')\n"
                                            "(losses, weights)\n")
    ip.run_cell_magic("horovod", "--np -2 --quiet", cell(2, save))
    trained = hvd_magic.last_run().results
    assert_as_one_process(trained)
    assert (tmp_path / "ckpt" / "latest").read_text() == "end"
    assert (tmp_path / "ckpt" / "end").is_dir()
    load = cell(2, "").split("g = torch.Generator()")[0].replace("manual_seed(0)", "manual_seed(7)")
    ip.run_cell_magic("horovod", "--np -2 --quiet",
                      load + "engine.load_checkpoint('ckpt')\n"
                             "[p.detach().tolist() for p in engine.module.parameters()]\n")
    for loaded in hvd_magic.last_run().results:
        for got, want in zip(loaded, trained[0][1]):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_a_killed_deepspeed_rank_is_named(ip):
    tail = "if rank == 1:\n    os.kill(os.getpid(), 9)\nengine.step()\nlosses\n"
    with pytest.raises(hvd_magic.RankError) as info:
        ip.run_cell_magic("horovod", "--np -2 --quiet", cell(2, tail))
    text = "\n".join(info.value._render_traceback_())
    assert info.value.rank == 1 and "SIGKILL" in text, text


def test_a_build_lock_left_by_a_dead_builder_is_cleared_and_said(tmp_path):
    """A process killed while it held torch's build lock leaves the lock file: every later
    build would wait for it forever. No live process holds it: it is removed, and said."""
    from hvd_magic.rank import deepspeed_setup
    build = tmp_path / "deepspeed_shm_comm"
    build.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time\n"
        f"fd = os.open({str(build / 'lock')!r}, os.O_CREAT | os.O_EXCL)\n"
        "print('held', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert deepspeed_setup.lock_holders(str(build / "lock")) == [holder.pid]
        assert deepspeed_setup.clear_stale_lock(str(build), "deepspeed_shm_comm") == "held"
        assert (build / "lock").exists()  # a live builder's lock is kept
    finally:
        holder.kill()
        holder.wait()
    assert deepspeed_setup.clear_stale_lock(str(build), "deepspeed_shm_comm") == "cleared"
    assert not (build / "lock").exists()


def test_the_first_build_says_what_it_compiles_and_a_built_op_says_nothing(tmp_path, monkeypatch,
                                                                            capfd):
    """torch's load of an op not yet in the host's folder is announced (what, why it waits, how
    to prebuild); of one built already, silent; a dead builder's lock is cleared first."""
    from hvd_magic.rank import deepspeed_setup
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("LOCAL_RANK", "0")
    build = tmp_path / "deepspeed_shm_comm"
    build.mkdir()
    (build / "lock").write_text("")  # no process holds it open: a dead builder's
    seen = []
    load = deepspeed_setup._announcing(lambda name, **kw: seen.append((name, (build / "lock").exists())))
    load("deepspeed_shm_comm", sources=[])
    err = capfd.readouterr().err
    assert "removed the build lock of DeepSpeed's op deepspeed_shm_comm" in err, err
    assert "compiling its C++ op deepspeed_shm_comm" in err and "hvd_magic.prebuild" in err, err
    assert seen == [("deepspeed_shm_comm", False)]  # torch's build then finds no lock
    (build / "deepspeed_shm_comm.so").write_bytes(b"")
    load("deepspeed_shm_comm", sources=[])
    assert capfd.readouterr().err == ""
    # beside a built op too: torch takes the lock to check the build, and would wait on it
    (build / "lock").write_text("")
    load("deepspeed_shm_comm", sources=[])
    assert "removed the build lock" in capfd.readouterr().err
    assert seen[-1] == ("deepspeed_shm_comm", False)


def test_deepspeed_torch_distributor_gives_a_function_its_config(ip):
    """pyspark's drops deepspeedConfig for a function; ours gives it to an initialize called
    without one."""
    def train():
        import torch, deepspeed
        model = torch.nn.Linear(4, 1)
        engine, *_ = deepspeed.initialize(
            model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        return engine.train_micro_batch_size_per_gpu(), engine.zero_optimization_stage()

    config = {"train_micro_batch_size_per_gpu": 3, "zero_optimization": {"stage": 1},
              "zero_allow_untested_optimizer": True}
    value = hvd_magic.DeepspeedTorchDistributor(numGpus=2, useGpu=False, deepspeedConfig=config,
                                                quiet=True).run(train)
    assert value == (3, 1)
    assert hvd_magic.last_run().results == [(3, 1), (3, 1)]
