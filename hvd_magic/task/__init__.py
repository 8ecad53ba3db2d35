"""What runs for one rank inside a Spark barrier task (or a driver thread, for ``--np -N``).

- `settings`: `TaskSettings`, what the driver sends each task; `Coordinator`, its siblings;
- `plan`: every task derives the Horovod plan and its own slot from the executors' addresses;
- `link`: the connection to the driver (events out, stop / dump / the relayed rendezvous in);
- `runner`: `run_task`: plan, the frameworks' rendezvous (`hvd_magic.frameworks`), spawn the rank process, forward its output, its outcome;
- `stopping`: ending a rank's process group.

Runs on executors: imports nothing of IPython or ipywidgets (pyspark only for the barrier context).
"""

from .runner import run_task, spark_task

__all__ = ["run_task", "spark_task"]
