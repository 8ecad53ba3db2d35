"""requirements/lock.txt: write it from a set-up venv, and say how two of them differ.

    python scripts/lockfile.py write VENV_PYTHON LOCK   every installed distribution at its version
    python scripts/lockfile.py diff OLD NEW             the releases that changed between two locks

The lock is a pip constraints file (scripts/setup.sh exports it as PIP_CONSTRAINT), so it pins
versions only: what is installed is still what pyproject.toml and the scripts ask for. Left out:
the project itself and Horovod (built here from source), and a version's local label (torch's
"+cpu": the lock names the release, the machine picks its build).
"""
import re
import subprocess
import sys

HEADER = """\
# The releases `make setup` installs (scripts/setup.sh: PIP_CONSTRAINT), the ones the suite last
# passed with. Made by `make lock` (scripts/refresh_lock.sh), which tries the newest releases and
# rewrites this file only when the suite passes with them; do not edit it by hand (a release to
# avoid is capped in requirements/caps.txt, with the reason).
"""
LEFT_OUT = {"hvd-magic", "hvd_magic", "horovod"}


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(python):
    out = subprocess.run([python, "-m", "pip", "list", "--format=freeze", "--exclude-editable"],
                         check=True, capture_output=True, text=True).stdout
    pins = {}
    for line in out.splitlines():
        name, sep, version = line.partition("==")
        if sep and canonical(name) not in LEFT_OUT:
            pins[canonical(name)] = version.split("+")[0]
    return pins


def read(path):
    pins = {}
    with open(path) as f:
        for line in f:
            name, sep, version = line.split("#")[0].strip().partition("==")
            if sep:
                pins[canonical(name)] = version.strip()
    return pins


def write(python, path):
    pins = installed(python)
    with open(path, "w") as f:
        f.write(HEADER)
        for name in sorted(pins):
            f.write(f"{name}=={pins[name]}\n")
    print(f"{path}: {len(pins)} releases")


def diff(old_path, new_path):
    old, new = read(old_path), read(new_path)
    changed = [f"  {n} {old[n]} -> {new[n]}" for n in sorted(old.keys() & new.keys())
               if old[n] != new[n]]
    added = [f"  {n} {new[n]} (new)" for n in sorted(new.keys() - old.keys())]
    removed = [f"  {n} {old[n]} (gone)" for n in sorted(old.keys() - new.keys())]
    lines = changed + added + removed
    print(f"{len(lines)} releases differ from {old_path}:" if lines else
          f"the same releases as {old_path}")
    print("\n".join(lines))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"write": write, "diff": diff}[command](*args)
