"""A user's own environment, made for a test: a new venv with hvd_magic installed from the
project's wheel by pip, and the packages a user would already have, but never Horovod (and,
when asked, never pyspark).

The packages are this sandbox's own (.venv's site-packages, each entry linked into the new
venv's, less the ones left out), so the environment costs seconds, not the minutes and gigabytes
of a download: what is left out is simply not there, as in an environment where it was never
installed. hvd_magic itself is installed by pip from the wheel, with its dependencies checked
against what is there (`--no-index`: nothing fetched), and its console scripts made.
"""

import os
import subprocess
import sys
import sysconfig
import venv

from conftest import ROOT

# never in a user's environment made this way: our own sandbox's copy of the project
OURS = ("hvd_magic", "__editable__", "_hvd_magic", "hvd-magic")


def build_wheel(dest):
    """The project's wheel, built from the checkout by pip as `pip wheel .` would; its path."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(dest), ROOT],
                   check=True, capture_output=True, text=True)
    (wheel,) = [n for n in os.listdir(dest) if n.endswith(".whl")]
    return os.path.join(dest, wheel)


def make_env(dest, wheel, without=("horovod",)):
    """A venv at `dest` with this sandbox's packages less `without` (their modules and their
    distributions) and hvd_magic from `wheel`; the path of its python."""
    dest = str(dest)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(dest)
    python = os.path.join(dest, "bin", "python")
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    theirs = subprocess.run([python, "-c", purelib],
                            check=True, capture_output=True, text=True).stdout.strip()
    ours = sysconfig.get_path("purelib")
    for name in os.listdir(ours):
        top = name.split("-")[0].split(".")[0].lower()
        if name.startswith(OURS) or top in without or name == "__pycache__":
            continue
        os.symlink(os.path.join(ours, name), os.path.join(theirs, name))
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-index", wheel],
                   check=True, capture_output=True, text=True)
    return python
