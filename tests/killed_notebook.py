"""A notebook of its own for tests/test_leaks.py: a real IPython shell that runs one
``%%horovod --np -1`` cell holding a value past the broadcast limit (so it travels as a value
file) until the test kills this process."""

from IPython.testing.globalipapp import start_ipython

CELL = """\
import os, time
print("FOLDER", os.path.dirname(os.environ["HVD_MAGIC_STACKS_FILE"]), len(ballast), flush=True)
time.sleep(300)
"""

if __name__ == "__main__":
    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    ip.user_ns["ballast"] = b"\0" * (5 << 20)  # past the 4 MB broadcast limit: a value file
    ip.run_cell_magic("horovod", "--np -1", CELL)
