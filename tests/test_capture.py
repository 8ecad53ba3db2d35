"""Cell capture, table-driven: each case runs a real cell on real ranks (--np 2) and checks the
values the ranks computed, or the message a mistake gets."""

import sys
import textwrap

import pytest
from IPython.core.error import UsageError

import hvd_magic

RANKS = "import os\nrank = int(os.environ['HOROVOD_RANK'])\n"

# (name, notebook setup, magic options, cell, expected rank values)
VALUE_CASES = [
    ("module", "import numpy as np", "",
     "int(np.arange(5).sum())", [10, 10]),
    ("dotted module import", "import os.path", "",
     "os.path.join('a', 'b')", ["a/b", "a/b"]),
    ("aliased submodule", "import torch.nn.functional as F\nimport torch", "",
     "float(F.relu(torch.tensor([-1.0, 2.0])).sum())", [2.0, 2.0]),
    ("from package import module", "from torch import nn", "",
     "type(nn.Linear(2, 3)).__name__", ["Linear", "Linear"]),
    ("from module import function", "from math import sqrt", "",
     "sqrt(16)", [4.0, 4.0]),
    ("from module import class", "from torch.utils.data import DataLoader", "",
     "len(list(DataLoader(list(range(6)), batch_size=2)))", [3, 3]),
    ("submodule reached through its package", "import xml.etree.ElementTree", "",
     "xml.etree.ElementTree.fromstring('<a>hi</a>').text", ["hi", "hi"]),
    ("aliased stdlib module", "import collections.abc as cabc", "",
     "isinstance([], cabc.Sequence)", [True, True]),
    ("notebook function with its own globals",
     "import numpy as np\nSCALE = 3\ndef helper(x):\n    return float(np.sqrt(x) * SCALE)", "",
     "helper(16)", [12.0, 12.0]),
    ("notebook function calling another",
     "def inner(x):\n    return x + 1\ndef outer(x):\n    return inner(x) * 2", "",
     "outer(4)", [10, 10]),
    ("notebook class", "class Acc:\n    def __init__(self):\n        self.total = 0\n"
     "    def add(self, x):\n        self.total += x\n        return self", "",
     RANKS + "Acc().add(rank).add(10).total", [10, 11]),
    ("dataclass config", "import dataclasses\n@dataclasses.dataclass\nclass Config:\n"
     "    lr: float = 0.1\n    layers: tuple = (4, 2)\ncfg = Config(lr=0.5)", "",
     "(cfg.lr, cfg.layers)", [(0.5, (4, 2))] * 2),
    ("plain values", "n = 3\nxs = [1, 2, 3]\nd = {'a': 1}\ns = 'hi'", "",
     "(n * 2, sum(xs), d['a'], s.upper())", [(6, 6, 1, "HI")] * 2),
    ("numpy array value", "import numpy as np\narr = np.ones((4, 4))", "",
     "float(arr.sum())", [16.0, 16.0]),
    ("pandas frame value", "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})", "",
     "int(df['a'].sum())", [6, 6]),
    ("rebinding a notebook name", "lr = 0.1", "",
     "import horovod.torch as hvd\nhvd.init()\nlr = lr * hvd.size()\nlr", [0.2, 0.2]),
    ("augmented assignment", "x = 41", "", "x += 1\nx", [42, 42]),
    ("loop accumulating into a notebook name", "total = 100", "",
     "for i in range(4):\n    total += i\ntotal", [106, 106]),
    ("name bound in the cell before use shadows an unpicklable one",
     "import threading\nwriter = threading.Lock()", "",
     "writer = 'made here'\nwriter", ["made here"] * 2),
    ("nested function reads a notebook constant", "K = 7", "",
     "def f(y):\n    return y * K\nf(2)", [14, 14]),
    ("class defined in the cell", "BASE = 5", "",
     "class C:\n    v = BASE + 1\nC.v", [6, 6]),
    ("comprehension over a notebook value", "items = [1, 2, 3]", "",
     "[i * i for i in items]", [[1, 4, 9]] * 2),
    ("notebook lambda", "square = lambda v: v * v", "", "square(9)", [81, 81]),
    ("no last expression", "", "", "y = 1", [None, None]),
    ("each rank's own value", "", "", RANKS + "rank * 100", [0, 100]),
    ("shell line", "", "", "out = !echo captured-{1 + 1}\nout", [["captured-2"]] * 2),
    ("shell line expands a cell variable", "", "",
     "word = 'hello'\nres = !echo {word}\nres[0]", ["hello"] * 2),
    ("a builtin the cell uses is not captured", "", "", "len(range(3))", [3, 3]),
]


@pytest.mark.parametrize("name, setup, options, cell, expected", VALUE_CASES,
                         ids=[c[0] for c in VALUE_CASES])
def test_capture_values(ip, fresh_ns, name, setup, options, cell, expected):
    if setup:
        ip.run_cell(setup).raise_error()
    value = ip.run_cell_magic("horovod", f"--np 2 --quiet {options}", cell)
    assert hvd_magic.last_run().results == expected
    assert value == expected[0]


# (name, notebook setup, magic options, cell, substrings of the UsageError)
USAGE_CASES = [
    # (line numbers as the editor shows them: the %%horovod line is line 1)
    ("line magic", "", "", "x = 1\n%time x\n", ["line 3", "%time", "line magic"]),
    ("nested cell magic", "", "", "%%timeit\n1\n", ["cell magic"]),
    ("global statement", "", "", "global g\ng = 1\n", ["line 2", "global"]),
    ("top-level return", "", "", "x = 1\nreturn x\n", ["line 3", "return"]),
    ("top-level yield", "", "", "yield 1\n", ["yield"]),
    ("top-level await", "", "", "import asyncio\nawait asyncio.sleep(0)\n", ["line 3", "await"]),
    ("unpicklable names, all at once",
     "import threading\nlock = threading.Lock()\ngen = (i for i in range(3))\nok = 1",
     "", "(lock, gen, ok)", ["lock", "gen", "no job was started", "inside the cell"]),
    ("export of a name rank 0 never defines", "", "--export nothere", "a = 1\n",
     ["nothere", "rank 0"]),
]


@pytest.mark.parametrize("name, setup, options, cell, words", USAGE_CASES,
                         ids=[c[0] for c in USAGE_CASES])
def test_capture_refusals(ip, fresh_ns, name, setup, options, cell, words):
    if setup:
        ip.run_cell(setup).raise_error()
    with pytest.raises((UsageError, hvd_magic.RankError)) as info:
        ip.run_cell_magic("horovod", f"--np 2 --quiet {options}", cell)
    text = "\n".join(info.value._render_traceback_()) if hasattr(
        info.value, "_render_traceback_") else str(info.value)
    for word in words:
        assert word in text, text


def test_unpicklable_names_start_no_spark_job(ip, fresh_ns):
    ip.run_cell("import threading\nlock = threading.Lock()").raise_error()
    ip.run_cell_magic("horovod", "--np 2 --quiet", "1")  # the session exists and is warm
    from pyspark import SparkContext
    store = SparkContext._active_spark_context._jsc.sc().statusStore()
    jobs_before = store.jobsList(None).size()
    with pytest.raises(UsageError):
        ip.run_cell_magic("horovod", "--np 2", "lock")
    assert store.jobsList(None).size() == jobs_before


def test_syntax_error_points_at_the_cells_line(ip):
    with pytest.raises(SyntaxError) as info:
        ip.run_cell_magic("horovod", "--np 2", "x = 1\ny = (2 +\n")
    assert info.value.lineno in (3, 4)  # the editor's line: %%horovod is line 1
    assert "hvd_magic cell" in info.value.filename


def test_trailing_semicolon_hides_the_value_but_keeps_results(ip):
    value = ip.run_cell_magic("horovod", "--np 2 --quiet", "21 * 2;")
    assert value is None
    assert hvd_magic.last_run().results == [42, 42]


def test_export_sets_rank0_values_in_the_notebook(ip, fresh_ns):
    cell = RANKS + "import torch\nmodel = torch.nn.Linear(2, 1)\nwho = rank\n"
    ip.run_cell_magic("horovod", "--np 2 --quiet --export model,who", cell)
    assert fresh_ns["who"] == 0
    assert type(fresh_ns["model"]).__name__ == "Linear"


def test_rank_imports_happen_in_the_body(ip, fresh_ns):
    """The rank starts as a fresh interpreter: the notebook's modules load only through the
    imports inserted into the cell's body."""
    ip.run_cell("import numpy as np\nimport IPython").raise_error()
    assert "numpy" in sys.modules
    cell = textwrap.dedent("""\
        import sys
        before = sys.modules['__main__'].MODULES_BEFORE_CALL
        (sorted(m for m in ('numpy', 'IPython', 'pyspark', 'torch') if m in before),
         'numpy' in sys.modules, int(np.ones(3).sum()))
        """)
    value = ip.run_cell_magic("horovod", "--np 2 --quiet --fresh", cell)
    assert value == ([], True, 3)
    # Forked from the template, a rank may hold numpy and torch before the cell (the template
    # imported them for it), never the notebook's IPython or pyspark.
    value = ip.run_cell_magic("horovod", "--np -2 --quiet", cell.replace("--fresh", ""))
    assert value[1:] == (True, 3) and not {"IPython", "pyspark"} & set(value[0])


def test_api_runs_functions_defined_anywhere(tmp_path):
    import json

    def make_closure(k):
        def closure(x):
            return x * k
        return closure

    closure = make_closure(3)
    assert hvd_magic.run(closure, np=2, args=(5,)).results == [15, 15]
    assert hvd_magic.run(lambda a, b=1: a + b, np=2, args=(1,), kwargs={"b": 2}).results == [3, 3]
    assert hvd_magic.run(json.dumps, np=2, args=([1],)).results == ["[1]", "[1]"]


def test_api_refuses_unpicklable_arguments_before_launch():
    import threading
    with pytest.raises(UsageError) as info:
        hvd_magic.run(print, np=2, args=(threading.Lock(),), kwargs={"g": (i for i in [])})
    assert "argument 0" in str(info.value) and "keyword g" in str(info.value)


def test_large_value_travels_by_broadcast_without_doubling_driver_memory(ip, fresh_ns):
    import gc
    import tracemalloc

    ip.run_cell_magic("horovod", "--np 4 --quiet", "1")  # warm session, not measured
    gc.collect()
    tracemalloc.start()
    try:
        ip.run_cell("import numpy as np\nbig = np.ones(25 * 1024 * 1024)").raise_error()  # 200 MiB
        nbytes = fresh_ns["big"].nbytes
        value = ip.run_cell_magic("horovod", "--np 4 --quiet", "(float(big.sum()), big.shape)")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert value == (float(25 * 1024 * 1024), (25 * 1024 * 1024,))
    run = hvd_magic.last_run()
    assert run.broadcast_names == ["big"]
    assert len(run.results) == 4
    # The array's buffer is written to the shared file from the array itself (payload.OutOfBand):
    # no pickled copy of it on the driver.
    assert peak < 1.3 * nbytes, f"driver peak {peak / 2**20:.0f} MiB for a {nbytes / 2**20:.0f} MiB array"


def test_a_failing_cell_names_its_prompt_and_the_editors_line(ip):
    """As IPython names a plain cell's frames: ``Cell In[N], line L``, N the cell's prompt and L
    the line as the editor numbers it (the %%horovod line is line 1)."""
    cell = ("%%horovod --np -2 --quiet\n"
            "def step(x):\n"
            "    return 1 / x\n"
            "\n"
            "step(0)\n")
    result = ip.run_cell(cell, store_history=True)  # (a prompt number: IPython 8 gives none else)
    text = "\n".join(result.error_in_exec._render_traceback_())
    n = result.execution_count
    assert f"Cell In[{n}], line 5\n" in text + "\n", text   # step(0), the cell's own frame
    assert f"Cell In[{n}], line 3, in step" in text         # the function it defined
    assert "hvd_magic cell" not in text and "ZeroDivisionError" in text
