"""The environment a rank starts from: its task's, less what only a Spark worker needs.

A Spark Python worker runs with Spark's own entries ahead of everything on ``PYTHONPATH``:
``pyspark.zip``, ``py4j-*-src.zip`` and the spark-core jar (16 MB, ~6000 entries, no Python in it).
A rank inherits them, and every import it makes (``import torch`` is ~1,700 modules) first
looks through those archives: ~0.1-0.2 s more start-up per rank than the same process without
them (bench/bench_launch.py's profile). The rank never imports pyspark, so they go: the jar
always, the zips when the same pyspark is installed as a package anyway (pip's pyspark, where
the rank's ``import pyspark``, if user code does one, still works).

Not for: Horovod's variables (`hvd_magic.frameworks`) or the rank's own settings.
"""

import os
import site


def _pyspark_installed():
    """A pyspark package in site-packages (not only inside Spark's zip)."""
    try:
        roots = site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # virtualenvs of old: no getsitepackages
        return False
    return any(os.path.isfile(os.path.join(root, "pyspark", "__init__.py")) for root in roots)


def _spark_only(entry, installed):
    name = os.path.basename(entry)
    if entry.endswith(".jar"):
        return True
    return installed and name.endswith(".zip") and (name == "pyspark.zip" or name.startswith("py4j-"))


def rank_base_env(environ=None):
    """A copy of `environ` (default os.environ) with Spark's worker-only PYTHONPATH entries
    removed; every other entry (the user's own) kept in its order."""
    env = dict(os.environ if environ is None else environ)
    path = env.get("PYTHONPATH")
    if not path or "SPARK_HOME" not in env and ".jar" not in path:
        return env
    installed = _pyspark_installed()
    kept = [e for e in path.split(os.pathsep) if e and not _spark_only(e, installed)]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        del env["PYTHONPATH"]
    return env
