"""The rank process: ``python -m hvd_magic.rank WORKDIR`` (`__main__`), and what runs inside it.

- `__main__`: the bootstrap: load the job, run the cell's function, leave its value or error;
- `reporting`: `hvd_magic.report()` and tqdm bars -> progress events for the driver;
- `stall`: tell the driver when this rank waits long in a collective (the hang watchdog);
- `shell`: ``!cmd`` lines of a cell, run here;
- `hooks`: run a patch right after a module is imported, without importing it ourselves.

Imports nothing of IPython, ipywidgets, pyspark or py4j: a rank starts as a fresh interpreter
and the cell's own imports are what load its modules (tested in tests/test_architecture.py).
"""
