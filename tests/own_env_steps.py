"""Run inside a user's own environment (`own_env.make_env`) by tests/test_anywhere.py: each step
named on the command line, in a real IPython shell, its outcome one JSON line on stdout:
``{"step": name, "value": ...}`` or ``{"step": name, "error": type, "message": text}``.

A step is what a user types: a %%distributed cell, hvd_magic.run, a warm session, the
TorchDistributor drop-in, a Horovod cell where Horovod is not installed...
"""

import json
import os
import sys
import traceback

DDP = """\
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo")
torch.manual_seed(0)                       # the same start on every rank
model = torch.nn.Linear(4, 1)
ddp = DistributedDataParallel(model)
x = torch.randn(8, 4, generator=torch.Generator().manual_seed(dist.get_rank()))  # its own batch
ddp(x).pow(2).mean().backward()            # DDP averages the ranks' gradients
torch.optim.SGD(ddp.parameters(), lr=0.5).step()
(dist.get_world_size(), model.weight.detach().flatten().tolist())
"""

LIGHTNING = """\
import os, torch, torch.distributed as dist
import lightning as L

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

x = torch.randn(32, 4, generator=torch.Generator().manual_seed(int(os.environ["RANK"])))
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)),
                                   batch_size=8)
model = Tiny()
trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=2, max_epochs=2, logger=False,
                    enable_checkpointing=False, enable_model_summary=False,
                    enable_progress_bar=False)
trainer.fit(model, data)
(trainer.world_size, model.layer.weight.detach().flatten().tolist())
"""

DATA = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rows = torch.tensor([float(hvd_magic.shard().num_rows)])
dist.all_reduce(rows)
(int(os.environ["RANK"]), hvd_magic.shard().num_rows, rows.item())
"""

HOROVOD = """\
import torch, horovod.torch as hvd
hvd.init()
hvd.rank()
"""


def total(offset):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + offset])
    dist.all_reduce(t)
    return t.item()


def horovod_size():
    import horovod.torch as hvd
    hvd.init()
    return hvd.size()


def steps(ip):
    import hvd_magic

    def cell(line, body, magic="distributed"):
        value = ip.run_cell_magic(magic, f"{line} --quiet", body)
        run = hvd_magic.last_run()
        return {"value": value, "results": run.results, "where": run.where}

    return {
        "where": lambda: hvd_magic.__file__,
        "ddp_driver": lambda: cell("--np -2", DDP),
        "ddp_spark": lambda: cell("--np 2", DDP),
        "run_function": lambda: hvd_magic.run(total, np=-2, args=(1.0,)).results,
        "lightning": lambda: cell("--np -2", LIGHTNING),
        "data": lambda: data(ip),
        "torch_distributor": lambda: hvd_magic.TorchDistributor(
            num_processes=2, local_mode=False, use_gpu=False, quiet=True).run(total, 1.0),
        "torch_distributor_local": lambda: hvd_magic.TorchDistributor(
            num_processes=2, local_mode=True, use_gpu=False, quiet=True).run(total, 1.0),
        "session": lambda: session(ip),
        "horovod_driver": lambda: cell("--np -2", HOROVOD, magic="horovod"),
        "horovod_spark": lambda: cell("--np 2", HOROVOD, magic="horovod"),
        "timeline": lambda: timeline(ip),
        "horovod_runner": lambda: hvd_magic.HorovodRunner(np=-2).run(horovod_size),
        "elastic": lambda: cell("--np -2 --min-np 1", HOROVOD, magic="horovod"),
        "pyspark_loaded": lambda: sorted(m for m in sys.modules
                                         if m.split(".")[0] in ("pyspark", "py4j")),
    }


def timeline(ip):
    """--timeline of torch code: every rank's profile, merged (no Horovod needed)."""
    import hvd_magic
    value = ip.run_cell_magic("distributed", "--np -2 --timeline-steps 2:2 --quiet", DDP.replace(
        "torch.optim.SGD(ddp.parameters(), lr=0.5).step()",
        "opt = torch.optim.SGD(ddp.parameters(), lr=0.5)\nopt.step(); opt.step()"))
    return {"value": value, "file": os.path.basename(hvd_magic.last_run().timeline_path)}


def data(ip):
    """A Spark DataFrame's rows shared out to the ranks (--data)."""
    import hvd_magic
    ip.run_cell("import os, hvd_magic\ndf = hvd_magic.spark_session().range(100)").raise_error()
    value = ip.run_cell_magic("distributed", "--np 2 --quiet --data df", DATA)
    return {"value": value, "results": hvd_magic.last_run().results}


def session(ip):
    """A warm session's ranks: a process group made in one cell, used in the next."""
    ip.run_line_magic("horovod_session", "start --np -2")
    try:
        run = lambda body: ip.run_cell_magic("distributed", "--quiet", body)  # noqa: E731
        run("import torch, torch.distributed as dist\ndist.init_process_group('gloo')")
        return run("t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)\nt.item()")
    finally:
        ip.run_line_magic("horovod_session", "stop")


def main(names):
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()  # (a user's environment may have no pytest)
    ip.run_line_magic("load_ext", "hvd_magic")
    known = steps(ip)
    for name in names:
        try:
            out = {"step": name, "value": known[name]()}
        except BaseException as exc:  # noqa: BLE001  (each step's outcome is the test's to judge)
            out = {"step": name, "error": type(exc).__name__, "message": str(exc),
                   "traceback": traceback.format_exc()}
        print(json.dumps(out, default=repr), flush=True)
    os._exit(0)  # (an embedded Spark's JVM is ended with the process)


if __name__ == "__main__":
    main(sys.argv[1:])
