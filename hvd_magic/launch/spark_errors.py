"""What a failed Spark stage said, in words a notebook user can act on: Java's first line
without its stack trace, and where Spark's Python workers lacked a module, whether they ran
another interpreter than the notebook's or the same one on executors that lack a package.

Not for: starting or checking sessions (`spark`, `sparkstart`).
"""

import os
import re
import shutil
import sys

from ..needs import missing_message, missing_module


def java_message(exc, workers_python=None):
    """The first line of what Java said, without the stack trace. `workers_python`: the
    interpreter Spark's Python workers were told to run, for the message when they lack a
    module."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    if "BarrierJobSlotsNumberCheckFailed" in text:
        return ("Spark could not schedule all ranks at once (not enough free task slots for a "
                "barrier stage). Use a smaller --np or add executors.")
    if "BarrierJobUnsupportedRDDChainException" in text or "dynamic allocation" in text.lower():
        return "Spark refused the barrier stage: " + first
    python = re.findall(r"^(\w+(?:Error|Exception): .*)$", text.split("SQLSTATE")[0], re.M)
    missing = [p for p in python if p.startswith(("ModuleNotFoundError", "ImportError"))]
    if "PythonException" in text and missing and workers_python:
        return wrong_python_message(missing[-1].strip(), workers_python)
    if "PythonException" in text and python:
        return (f"a Spark task failed before its rank started: {python[-1].strip()}. Check that "
                "the executors have the same Python and packages as the driver (torch, horovod, "
                "hvd_magic, cloudpickle): %horovod_env compares them, executor by executor.")
    return first


def wrong_python_message(error, workers_python):
    """Spark's Python workers lacked a module: another interpreter than this notebook's (without
    our packages), or this very one on executors that lack what the driver has."""
    here = sys.executable
    if same_interpreter(workers_python):
        package = missing_module(error)
        where = f"the executors' Python ({workers_python}, the notebook's own path)"
        if package is not None:
            return (f"Spark's Python workers could not start the ranks ({error}): "
                    + missing_message(package, "this run", where=where, python=workers_python))
        return (f"Spark's Python workers could not start the ranks ({error}) with "
                f"{workers_python}: the executors' copy of that environment lacks what the "
                f"driver's has. Install the same packages there; %horovod_env compares them.")
    found = shutil.which(workers_python)
    ran = workers_python + (f" (here: {os.path.realpath(found)})"
                            if found and found != workers_python else "")
    return (f"Spark's Python workers could not start the ranks ({error}): they ran {ran}, and "
            f"this notebook runs {here}. Set PYSPARK_PYTHON={here} (or the Spark setting "
            f"spark.pyspark.python) where the SparkSession or Connect server is created, before "
            f"it starts, then restart it; %horovod_env compares the executors' packages with "
            f"the notebook's.")


def same_interpreter(command):
    """Whether `command` runs this very Python, environment and all: a venv's python is a link
    to its base interpreter, so the same file is not enough; the same folder of it is."""
    found = shutil.which(command)
    if not found:
        return False
    here = sys.executable
    return (os.path.realpath(found) == os.path.realpath(here)
            and os.path.realpath(os.path.dirname(os.path.abspath(found)))
            == os.path.realpath(os.path.dirname(os.path.abspath(here))))
