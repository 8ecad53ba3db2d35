"""The GPU check: hvd_magic installed from its wheel on a machine with a GPU, as a user's own
environment is (a CUDA torch, Lightning, accelerate; no pyspark, no Java, no Horovod), and a
``%%distributed --np -1`` DDP cell run there with NCCL on the GPU.

    python bench/gpu_check.py [--wheel dist/hvd_magic-*.whl] [--out DIR] [--cpu]

1. A venv that sees the machine's packages (its torch, Lightning, accelerate stay as they
   are); the wheel installed there by pip with nothing from the network
   (``--no-index``), built from this checkout when none is given. A dependency the machine
   lacks is named in the report.
2. In that venv, a real IPython shell (this file again, ``--cells``):
   - the seeds' pinning line (``set_device(LOCAL_RANK)``) and torch's current device before
     it; 1 GiB held on the GPU, the sampler's peak GPU memory beside
     ``torch.cuda.memory_allocated``;
   - ``%%distributed --np -1`` with NCCL: the rank's ``CUDA_VISIBLE_DEVICES``, its GPU, and a
     small model's training steps/s, beside the same loop in a plain Python process on the
     same GPU (no DDP, no hvd_magic);
   - a Lightning ``Trainer(accelerator="gpu", devices=1)`` fit on that rank;
   - ``--np -2`` on one GPU: with NCCL (refused as the group starts, saying what to do), and
     with Gloo (the two ranks share the GPU).
3. The report: printed, and `DIR/gpu_check.json` (``$OUT`` by default).

``--cpu``: the same steps with Gloo on the CPU, to check the script where there is no GPU.
Not a test (the suite runs where there is no GPU); its output goes into BENCHMARKS.md.
"""

import argparse
import glob
import json
import os
import site
import subprocess
import sys
import tempfile
from venv import EnvBuilder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A small MLP's training loop; its last line is the cell's value. {ddp}: wrap it in DDP.
TRAIN = """\
import os, time, torch
import torch.distributed as dist
device = torch.device({device!r}, 0) if {device!r} == "cuda" else torch.device("cpu")
if {ddp}:
    from torch.nn.parallel import DistributedDataParallel
    dist.init_process_group({backend!r})
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 10)).to(device)
net = DistributedDataParallel(model, device_ids=[0] if {device!r} == "cuda" else None) \\
    if {ddp} else model
opt = torch.optim.SGD(net.parameters(), lr=0.01)
x, y = torch.randn(256, 1024, device=device), torch.randint(0, 10, (256,), device=device)

def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    opt.step()

def sync():
    if device.type == "cuda":
        torch.cuda.synchronize()

for _ in range(20):
    step()
sync()
start = time.perf_counter()
for _ in range({steps}):
    step()
sync()
({steps} / (time.perf_counter() - start), os.environ.get("CUDA_VISIBLE_DEVICES"),
 torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
 dist.get_world_size() if {ddp} else 1)
"""

LIGHTNING = """\
import torch, lightning as L

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 1)
    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

x = torch.randn(512, 32)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)),
                                   batch_size=64)
model = Tiny()
trainer = L.Trainer(accelerator={accelerator!r}, devices=1, max_epochs=3, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False)
trainer.fit(model, data)
(str(model.device), trainer.world_size, float(trainer.callback_metrics["train_loss"]))
"""

SHARE = """\
import torch, torch.distributed as dist
dist.init_process_group({backend!r})
t = torch.ones(1, device={device!r})
dist.all_reduce(t)
t.item()
"""


# The seeds' pinning line, and torch's current device before it (hvd_magic's own pinning).
PIN = """\
import os, torch
unpinned = torch.cuda.current_device() if torch.cuda.is_available() else None
if torch.cuda.is_available():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
(unpinned, torch.cuda.current_device() if torch.cuda.is_available() else None,
 os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("HVD_MAGIC_GPUS"))
"""

# 1 GiB held for 4 s: the sampler (each second, NVML) against torch's own count.
MEMORY = """\
import time, torch
device = {device!r}
held = torch.empty(256 * 1024 * 1024, dtype=torch.float32, device=device)
time.sleep(4)
torch.cuda.memory_allocated() if device == "cuda" else held.numel() * 4
"""


def cells(cpu):
    """(name, magic line, body) of each cell the venv runs."""
    device, backend = ("cpu", "gloo") if cpu else ("cuda", "nccl")
    train = TRAIN.format(device=device, backend=backend, ddp=True, steps=200)
    return [("pin_np1", "--np -1", PIN),
            ("memory_np1", "--np -1", MEMORY.format(device=device)),
            ("ddp_np1", "--np -1", train),
            ("lightning_np1", "--np -1", LIGHTNING.format(accelerator=device)),
            ("nccl_np2_one_gpu", "--np -2", SHARE.format(backend=backend, device=device)),
            ("gloo_np2_one_gpu", "--np -2", SHARE.format(backend="gloo", device=device))]


def run_cells(cpu):
    """In the venv: each cell in a real IPython shell, one JSON line of outcome each."""
    from IPython.core.interactiveshell import InteractiveShell
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "hvd_magic")
    import hvd_magic
    for name, line, body in cells(cpu):
        try:
            value = ip.run_cell_magic("distributed", line + " --text", body)
            run = hvd_magic.last_run()
            out = {"step": name, "value": value, "seconds": round(run.elapsed, 2),
                   "gpus": [r.gpus for r in run.ranks],
                   "sampled_peak_gpu_mem": [(r.usage.as_dict() or {}).get("peak_gpu_mem")
                                            for r in run.ranks]}
        except BaseException as exc:  # noqa: BLE001  (each outcome is reported, not judged)
            out = {"step": name, "error": type(exc).__name__, "message": str(exc)[-2000:]}
        print(json.dumps(out, default=repr), flush=True)


def plain(cpu):
    """The same loop in a plain Python process, no DDP, no hvd_magic: its steps/s."""
    body = TRAIN.format(device="cpu" if cpu else "cuda", backend="", ddp=False, steps=200)
    head, last = body.rsplit("\n(", 1)
    code = f"{head}\nprint(repr(({last}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return done.stdout.strip() or done.stderr.strip()[-1000:]


def install(work, wheel):
    """A venv with the machine's packages and the wheel; its python, and what pip said."""
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                        "--no-build-isolation", "-w", work, ROOT], check=True)
        wheel = glob.glob(os.path.join(work, "hvd_magic-*.whl"))[0]
    venv = os.path.join(work, "env")
    EnvBuilder(symlinks=True).create(venv)
    python = os.path.join(venv, "bin", "python")
    # The machine's packages seen from the venv (as --system-site-packages would, but from this
    # interpreter's, a venv's or conda's too); the venv's own site-packages, hvd_magic's, first.
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    theirs = subprocess.run([python, "-c", purelib],
                            capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(theirs, "machine.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    pip = subprocess.run([python, "-m", "pip", "install", "--no-index", wheel],
                         capture_output=True, text=True)
    said = "ok" if pip.returncode == 0 else pip.stderr.strip()[-1500:]
    if pip.returncode:  # a dependency this machine lacks (named above): the package alone
        subprocess.run([python, "-m", "pip", "install", "--no-index", "--no-deps", wheel],
                       check=True, capture_output=True)
    return python, said


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", help="hvd_magic's wheel (default: built from this checkout)")
    parser.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    parser.add_argument("--cpu", action="store_true", help="Gloo on the CPU: a dry run")
    parser.add_argument("--cells", action="store_true", help=argparse.SUPPRESS)  # (in the venv)
    args = parser.parse_args()
    if args.cells:
        return run_cells(args.cpu)
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="gpu-check-")
    python, installed = install(work, args.wheel)
    probe = subprocess.run(
        [python, "-c", "import sys, torch, importlib.util as u; print(sys.version.split()[0], "
         "torch.__version__, torch.cuda.device_count(), 'GPUs;', [m for m in ('pyspark', "
         "'horovod', 'lightning', 'accelerate') if u.find_spec(m)])"],
        capture_output=True, text=True)
    report = {"install": installed, "environment": (probe.stdout or probe.stderr).strip(),
              "plain_python (steps/s, visible, device, world)": plain(args.cpu)}
    mode = ["--cpu"] if args.cpu else []
    done = subprocess.run([python, os.path.abspath(__file__), "--cells", *mode],
                          capture_output=True, text=True, cwd=work, timeout=540)
    report["cells"] = [json.loads(line) for line in done.stdout.splitlines()
                       if line.startswith('{"step"')]
    if len(report["cells"]) < len(cells(args.cpu)):
        report["tail"] = (done.stdout + done.stderr)[-3000:]
    with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
        json.dump(report, f, indent=1, default=repr)
    for key, value in report.items():
        for item in (value if key == "cells" else [value]):
            print(f"{key}: {json.dumps(item, default=repr)[:1200]}")


if __name__ == "__main__":
    main()
