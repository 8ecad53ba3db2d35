"""Training scripts on N ranks: ``%horovod --np 2 train.py args`` and ``hvd_magic.run_script``.

The script is written as people write them for horovodrun (argparse, ``if __name__ ==
"__main__":``, a sibling module, rank 0 saving a checkpoint) and runs unchanged.
"""

import os
import textwrap

import pytest
from IPython.core.error import UsageError

import hvd_magic
from conftest import spark_session
from hvd_magic.capture.modules import script_modules

TRAIN = textwrap.dedent("""\
    import argparse
    import sys

    import torch
    import horovod.torch as hvd

    from schedule import scaled_lr


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 1)


    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=1)
        parser.add_argument("--lr", type=float, default=0.1)
        parser.add_argument("--checkpoint", default="checkpoint.pt")
        parser.add_argument("--exit-rank", type=int, default=-1)
        parser.add_argument("--timeout", type=float, default=0.0)  # one of %horovod's names too
        args = parser.parse_args()
        hvd.init()
        torch.manual_seed(0)
        model = Net()
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=scaled_lr(args.lr, hvd.size())),
            named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        for epoch in range(args.epochs):
            optimizer.zero_grad()
            loss = model.fc(torch.ones(8, 4) * (hvd.rank() + 1)).pow(2).mean()
            loss.backward()
            optimizer.step()
            print(f"epoch {epoch} argv {sys.argv[1:]} name {__name__}")
        if hvd.rank() == args.exit_rank:
            sys.exit(3)
        if hvd.rank() == 0:
            torch.save(model, args.checkpoint)  # pickles __main__.Net
        sys.exit(0)


    if __name__ == "__main__":
        main()
    """)


@pytest.fixture
def script_folder(tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text(TRAIN)
    (folder / "schedule.py").write_text("def scaled_lr(lr, size):\n    return lr * size\n")
    (folder / "unrelated.py").write_text("raise RuntimeError('never imported')\n")
    return folder


def test_the_magic_runs_a_horovodrun_script_on_spark(ip, script_folder, capsys):
    spark_session(2)
    checkpoint = script_folder / "model.pt"
    ip.run_line_magic("horovod", f"--np 2 --text --timeline --name scripted {script_folder}/train.py "
                                 f"--epochs 2 --checkpoint {checkpoint} --timeout 0.5")
    out = capsys.readouterr().out
    # options after the script's path are the script's own (a --timeout of 0.5 s too)
    argv = f"['--epochs', '2', '--checkpoint', '{checkpoint}', '--timeout', '0.5']"
    for rank in (0, 1):
        assert f"[rank {rank}] epoch 1 argv {argv} name __main__" in out
    run = hvd_magic.last_run()
    assert (run.state, run.results, run.name) == ("done", [None, None], "scripted")
    assert "epoch 0" in open(run.log_path(1)).read()
    assert run.timeline_path and os.path.getsize(run.timeline_path) > 0  # rank 0's, brought back
    assert os.path.getsize(checkpoint) > 0  # rank 0's torch.save(model) of a __main__ class


def test_a_failing_rank_shows_the_scripts_own_traceback_and_exit_code(script_folder):
    with pytest.raises(hvd_magic.RankError) as failure:
        hvd_magic.run_script(str(script_folder / "train.py"),
                             args=["--exit-rank", "1", "--checkpoint", "x.pt"], np=-2)
    text = str(failure.value)
    assert "rank 1" in failure.value.headline()
    assert "train.py exited with code 3" in text
    assert f'File "{script_folder}/train.py", line 38, in main' in text  # the sys.exit line
    assert "sys.exit(3)" in text


def test_bad_script_lines_say_what_to_do(ip, script_folder):
    with pytest.raises(UsageError, match="No script 'missing.py'"):
        ip.run_line_magic("horovod", "--np -2 missing.py")
    with pytest.raises(UsageError, match="%%horovod"):
        ip.run_line_magic("horovod", "--np -2")
    with pytest.raises(UsageError, match="line magic %horovod"):
        ip.run_cell_magic("horovod", f"--np -2 {script_folder}/train.py", "1")
    with pytest.raises(UsageError, match="--export"):
        ip.run_line_magic("horovod", f"--np -2 --export x {script_folder}/train.py")
    (script_folder / "broken.py").write_text("x = (\n")
    with pytest.raises(SyntaxError) as error:
        hvd_magic.run_script(str(script_folder / "broken.py"), np=-2)
    assert error.value.filename.endswith("broken.py")


def test_only_the_modules_beside_the_script_that_it_imports_are_shipped(script_folder):
    (script_folder / "pkg").mkdir()
    (script_folder / "pkg" / "__init__.py").write_text("from .inner import VALUE\n")
    (script_folder / "pkg" / "inner.py").write_text("VALUE = 1\n")
    (script_folder / "schedule.py").write_text("import pkg\n\ndef scaled_lr(lr, size):\n"
                                               "    return lr * size\n")
    shipped = script_modules(str(script_folder / "train.py"), TRAIN)
    assert sorted(shipped) == ["pkg/__init__.py", "pkg/inner.py", "schedule.py"]
