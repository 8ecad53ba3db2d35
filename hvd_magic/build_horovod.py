"""``python -m hvd_magic.build_horovod``: Horovod 0.28.1, patched, built for this environment.

For a person who installed hvd_magic with pip and wants Horovod beside it: the published 0.28.1
does not compile against torch >= 2.1, so we compile it from its source with our patches against
the torch and TensorFlow already installed, and install it. Before anything starts it says what it
will do, how long that takes and what disk it needs, and it refuses at once (one line, exit
code 2) what would otherwise fail minutes into the compile: no torch, no C++ compiler, no
``patch``, no ``bash``, no Python headers, too little free disk.

Not the recipe itself: that is ``horovod_build/build.sh`` beside this module (package data, with
its patches), the one recipe ``make setup`` and binder run too (through
scripts/build_horovod.sh), so every environment's wheel is keyed and cached the same way. Not for
a cluster's executors from afar: run it in each environment the ranks use.
"""

import argparse
import glob
import json
import math
import os
import shutil
import subprocess
import sys
import time

RECIPE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "horovod_build", "build.sh")
VERSION = "0.28.1"
# Measured in a build on a 2-core machine (docs/install.md): the work folder at its largest,
# 578 MB (the 3.4 MB sdist, the patched tree, cmake's objects, the wheel), and the wheel the
# cache keeps, 32 MB. The minutes: about one serial (download, cmake's configure, linking), the
# rest split over the cores by make -j.
BUILD_TREE_MB = 600
WHEEL_MB = 32
SERIAL_MINUTES, PARALLEL_CORE_MINUTES = 1, (10, 18)

# What the environment's own interpreter has, asked of it once; nothing here imports torch.
PROBE = """
import importlib.util, json, os, sys, sysconfig
from importlib.metadata import PackageNotFoundError, version
def installed(*names):
    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            pass
print(json.dumps({
    "python": "%d.%d" % sys.version_info[:2],
    "torch": installed("torch"),
    "tensorflow": installed("tensorflow-cpu", "tensorflow"),
    "pip": importlib.util.find_spec("pip") is not None,
    "headers": os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
}))
"""


class Refusal(Exception):
    """What is missing, and what to do about it: one line for the person, exit code 2."""


def parse(argv):
    parser = argparse.ArgumentParser(
        prog="python -m hvd_magic.build_horovod",
        description=f"Build Horovod {VERSION} with hvd_magic's patches against the torch (and "
                    "TensorFlow) installed in an environment, keep the wheel in "
                    "~/.cache/hvd_magic/wheels, and install it there. A second run, or another "
                    "environment with the same Python, torch and TensorFlow, installs in seconds.")
    parser.add_argument("--prefix", default=sys.prefix,
                        help="the environment to build for and install into: a venv or conda "
                             "prefix with bin/python (default: this interpreter's, %(default)s)")
    parser.add_argument("--wheel-only", action="store_true",
                        help="build the wheel into the cache (if it is not there) and stop; "
                             "nothing is installed")
    parser.add_argument("--stock", action="store_true",
                        help="only the patches it takes to compile (for benchmarks against "
                             "unpatched Horovod; hvd_magic needs the others)")
    parser.add_argument("--dry-run", action="store_true",
                        help="say what would be done, and its time and disk, then stop")
    return parser.parse_args(argv)


def compiler():
    """The C++ compiler cmake will pick: $CXX where set (conda's compilers set it), else g++/c++."""
    named = os.environ.get("CXX", "").split(" ")[0]
    return next(filter(None, (shutil.which(c) for c in (named, "g++", "c++") if c)), None)


# The commands the build runs: their Debian and conda-forge packages.
TOOLS = {"bash": ("bash", "bash"), "g++": ("g++", "cxx-compiler"), "patch": ("patch", "patch")}


def missing_tools():
    """The commands the build needs that this PATH lacks."""
    found = {"bash": shutil.which("bash"), "g++": compiler(), "patch": shutil.which("patch")}
    return [name for name, path in found.items() if not path]


def in_words(names):
    return f"{', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else names[0]


def probe(prefix):
    """The environment's Python, torch, TensorFlow, pip and headers, as its interpreter says."""
    python = os.path.join(prefix, "bin", "python")
    if not os.access(python, os.X_OK):
        raise Refusal(f"{prefix} has no bin/python: give --prefix a venv or conda environment.")
    out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True)
    if out.returncode:
        raise Refusal(f"{python} does not run: {last_line(out.stderr)}")
    return json.loads(out.stdout)


def last_line(text):
    """A child's error in one line: a traceback's last line says what went wrong."""
    lines = text.strip().splitlines()
    return lines[-1] if lines else "(no message)"


def check(prefix):
    """The environment, or a Refusal naming the first thing that would make the build fail."""
    tools = missing_tools()
    if tools:
        apt, conda = (" ".join(TOOLS[t][i] for t in tools) for i in (0, 1))
        raise Refusal(
            f"building Horovod needs {in_words(tools)}, not found on PATH. Install "
            f"{'it' if len(tools) == 1 else 'them'} (Debian/Ubuntu: sudo apt-get install {apt}; "
            f"conda: conda install -c conda-forge {conda}) and run this again.")
    env = probe(prefix)
    if not env["torch"]:
        others = " (TensorFlow alone is not enough: the recipe builds for torch)" \
            if env["tensorflow"] else " and no TensorFlow"
        raise Refusal(f"{prefix} has no torch{others}. Horovod is compiled against the torch "
                      f"installed there: `{prefix}/bin/python -m pip install torch`, then run "
                      "this again.")
    if not env["pip"]:
        raise Refusal(f"{prefix} has no pip, which fetches Horovod's source: "
                      f"`{prefix}/bin/python -m ensurepip`, then run this again.")
    if not env["headers"]:
        raise Refusal(f"Python {env['python']}'s headers (Python.h) are missing, which the "
                      f"compile needs: install python{env['python']}-dev (Debian/Ubuntu) and "
                      "run this again.")
    return env


def recipe(prefix, args, *extra):
    """The command that runs the recipe for this environment and these options."""
    return ["bash", RECIPE, prefix] + (["stock"] if args.stock else []) + list(extra)


def wheel_dir(prefix, args):
    """Where the recipe keeps this environment's wheel (its cache key), as the recipe says."""
    out = subprocess.run(recipe(prefix, args, "--print-wheel-dir"), capture_output=True,
                         text=True)
    if out.returncode:
        raise Refusal(f"the recipe could not read this environment's versions (is its torch "
                      f"broken?): {last_line(out.stderr)}")
    return out.stdout.strip()


def minutes(cores):
    """'6-10 minutes' on 2 cores, fewer on more (the compile runs make -j<cores>)."""
    low, high = (math.ceil(SERIAL_MINUTES + m / cores) for m in PARALLEL_CORE_MINUTES)
    return f"{low}-{high} minutes"


def free_mb(folder):
    return shutil.disk_usage(folder).free // 2**20


def size(mb):
    return f"{mb / 1024:.0f} GB" if mb >= 10 * 1024 else f"{mb} MB"


def plan(prefix, args, env, wheels):
    """("installed" | "cached" | "build", what this run will do in words); a Refusal where the
    disk is too small for the build."""
    what = f"Horovod {VERSION} ({'stock' if args.stock else 'patched'}) for Python " \
           f"{env['python']}, torch {env['torch']}, TensorFlow {env['tensorflow'] or 'none'}"
    key_file = os.path.join(prefix, ".horovod-key")
    installed = None
    if os.path.exists(key_file):
        with open(key_file) as f:
            installed = f.read().strip()
    if installed == wheels and not args.wheel_only:
        return "installed", [f"{what}: already installed in {prefix} from {wheels}; checking "
                             "that it imports."]
    if glob.glob(os.path.join(wheels, "horovod-*.whl")):
        done = "nothing to build" if args.wheel_only else f"installing it into {prefix} (seconds)"
        return "cached", [f"{what}: the wheel is cached in {wheels}: {done}."]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    tmp = os.environ.get("TMPDIR") or "/tmp"  # where the recipe's mktemp -d puts its work
    cmake = shutil.which("cmake") or "not found: fetched from PyPI into the build folder"
    # Room to spare: pip's own temporary files, and cmake's wheel where it must be fetched.
    if free_mb(tmp) < BUILD_TREE_MB * 1.5:
        raise Refusal(f"the build needs about {BUILD_TREE_MB} MB in {tmp}, which has "
                      f"{size(free_mb(tmp))} free: free some, or point TMPDIR at a larger disk.")
    then = "and stop (--wheel-only)" if args.wheel_only else f"and install it into {prefix}"
    which = "the patches it needs to compile" if args.stock else "hvd_magic's patches"
    scale = "" if cores == 2 else " (6-10 on 2)"
    return "build", [
        f"{what}: not built yet. It will download Horovod's source from PyPI, apply {which}, "
        f"compile it, keep the wheel in {wheels} {then}.",
        f"Time: about {minutes(cores)} on this machine's {cores} CPU cores{scale}.",
        f"Disk: about {BUILD_TREE_MB} MB in {tmp} while it builds ({size(free_mb(tmp))} free), "
        f"{WHEEL_MB} MB for the wheel in the cache.",
        f"Uses: {compiler()} (C++17), {shutil.which('patch')}, cmake ({cmake}).",
    ]


def run_recipe(command, building):
    """Run the recipe, its output passed through; while it compiles (minutes, pip --quiet) say
    every minute that it still does, so a silent terminal does not look hung."""
    start = time.monotonic()
    child = subprocess.Popen(command)
    try:
        while True:
            try:
                child.wait(timeout=60)
                break
            except subprocess.TimeoutExpired:
                if building:
                    print(f"horovod: still building ({(time.monotonic() - start) / 60:.0f} min)",
                          flush=True)
    except KeyboardInterrupt:
        # The recipe got the same SIGINT (one process group): let it remove its work folder.
        child.wait()
        return 130
    if building and child.returncode == 0:
        print(f"horovod: built in {(time.monotonic() - start) / 60:.1f} minutes")
    return child.returncode


def main(argv=None):
    args = parse(argv)
    prefix = os.path.abspath(args.prefix)
    try:
        env = check(prefix)
        wheels = wheel_dir(prefix, args)
        state, lines = plan(prefix, args, env, wheels)
    except Refusal as refusal:
        print(f"hvd_magic.build_horovod: {refusal}", file=sys.stderr)
        return 2
    print("\n".join(lines), flush=True)
    if args.dry_run:
        return 0
    extra = ["--wheel-only"] if args.wheel_only else []
    return run_recipe(recipe(prefix, args, *extra), building=state == "build")


if __name__ == "__main__":
    sys.exit(main())
