"""``python -m hvd_magic.prebuild deepspeed [OP ...]``: DeepSpeed's C++ ops built ahead of a run,
into the folder the ranks of this host look in (`hvd_magic.rank.deepspeed_setup`), so the first
DeepSpeed cell does not wait minutes for them. Without OPs: those ``deepspeed.init_distributed()``
needs on this host's accelerator (``ShareMemCommBuilder`` on CPU); OPs are DeepSpeed's builder
names (``CPUAdamBuilder``, ``FusedAdamBuilder``...) for what a config asks for.

Run it on each host of a cluster (an init script), or once here for ``--np -N``. Not for: the
notebook (it imports DeepSpeed and torch).
"""

import argparse
import os
import sys
import time

DEFAULT_OPS = {"cpu": ("ShareMemCommBuilder",)}


def prebuild_deepspeed(ops=()):
    """Build `ops` (DeepSpeed builder names; default: what init_distributed needs here). Returns
    {op: seconds}."""
    from .rank import deepspeed_setup, hooks
    try:
        import torch
        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
    except ImportError:
        sys.exit("hvd_magic.prebuild: torch is not installed in this Python: DeepSpeed needs it")
    hooks.when_imported("deepspeed", deepspeed_setup._on_import)
    import deepspeed  # noqa: F401  (the hook sets the host's folder)
    from deepspeed.accelerator import get_accelerator
    accelerator = get_accelerator()
    took = {}
    for op in ops or DEFAULT_OPS.get(accelerator.device_name(), ()):
        builder = accelerator.create_op_builder(op)
        if builder is None:
            print(f"hvd_magic.prebuild: {op}: none on the {accelerator.device_name()} accelerator")
            continue
        start = time.monotonic()
        builder.load()
        took[op] = time.monotonic() - start
        print(f"hvd_magic.prebuild: {op} ({builder.NAME}) ready in {took[op]:.1f} s, in "
              f"{os.environ[deepspeed_setup.EXTENSIONS]}", flush=True)
    return took


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hvd_magic.prebuild", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("framework", choices=["deepspeed"])
    parser.add_argument("ops", nargs="*", help="DeepSpeed op builder names (default: those "
                        "init_distributed needs on this host)")
    args = parser.parse_args(argv)
    prebuild_deepspeed(args.ops)


if __name__ == "__main__":
    main()
