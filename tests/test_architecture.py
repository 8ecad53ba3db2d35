"""The house stays as docs/ARCHITECTURE.md says: every module named there, imports one way, the
rank side free of the notebook's and Spark's packages, no room too big.

Read from the source (AST), imports inside functions included: a lazy import is still an arrow.
"""

import ast
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
PACKAGE = os.path.join(ROOT, "hvd_magic")
DOC = os.path.join(ROOT, "docs", "ARCHITECTURE.md")
NOTEBOOK_SIDE = ("IPython", "ipywidgets", "ipykernel", "pyspark", "py4j")


def modules():
    """{"hvd_magic.driver.loop": "driver/loop.py", ...} for every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), PACKAGE).replace(os.sep, "/")
                dotted = "hvd_magic." + rel[:-3].replace("/", ".")
                found[dotted.removesuffix(".__init__")] = rel
    return found


def imports(module, rel, top_level_only=False):
    """Absolute names `module` imports (a relative import resolved against its package)."""
    tree = ast.parse(open(os.path.join(PACKAGE, rel)).read())
    package = module if rel.endswith("__init__.py") else module.rpartition(".")[0]
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.append(base)
            names += [f"{base}.{a.name}" for a in node.names]
    return names


def internal_edges(top_level_only=False):
    mods = modules()
    edges = {}
    for module, rel in mods.items():
        targets = set()
        for name in imports(module, rel, top_level_only):
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != module and name != "hvd_magic":
                targets.add(name)
        edges[module] = targets
    return edges


def test_the_page_names_every_module_and_no_other():
    text = open(DOC).read()
    named = set(re.findall(r"`([a-z_]+(?:/[a-z_]+)*\.py)`", text))
    actual = set(modules().values())
    assert actual - named == set(), "modules missing from docs/ARCHITECTURE.md"
    assert named - actual == set(), "docs/ARCHITECTURE.md names modules that do not exist"


def test_readme_links_the_page():
    assert "docs/ARCHITECTURE.md" in open(os.path.join(ROOT, "README.md")).read()


def test_no_import_cycles():
    edges = internal_edges()
    cycles = []

    def visit(module, path):
        for target in edges[module]:
            if target in path:
                cycles.append(path[path.index(target):] + [target])
            elif target not in done:
                visit(target, path + [target])
        done.add(module)

    done = set()
    for module in sorted(edges):
        if module not in done:
            visit(module, [module])
    assert cycles == []


def reachable(start, edges):
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += edges.get(module, ())
    return seen


def test_the_rank_side_imports_nothing_of_the_notebook_or_spark():
    # What a rank process loads: the rank package (every import, lazy ones too) and, through the
    # package, whatever those modules import at their top level.
    mods = modules()
    lazy = internal_edges()
    top = internal_edges(top_level_only=True)
    rank_side = {m for m in mods if m.startswith("hvd_magic.rank")} | {"hvd_magic.timelines.record"}
    edges = {m: (lazy[m] if m in rank_side else top[m]) for m in mods}
    loaded = reachable("hvd_magic", edges)  # `python -m hvd_magic.rank` imports the package first
    for module in rank_side:
        loaded |= reachable(module, edges)
    bad = {m: n for m in loaded for n in imports(m, mods[m], top_level_only=m not in rank_side)
           if n.split(".")[0] in NOTEBOOK_SIDE}
    assert bad == {}
    assert not any(m.startswith(("hvd_magic.view", "hvd_magic.driver", "hvd_magic.launch"))
                   for m in loaded)


@pytest.mark.parametrize("folder", ["capture", "launch", "data", "task", "frameworks", "rank", "driver",
                                    "timelines", "view", "api"])
def test_views_and_front_doors_are_imported_only_by_the_notebook_side(folder):
    edges = internal_edges()
    below = ("hvd_magic.frontends",) if folder == "view" else ("hvd_magic.view", "hvd_magic.frontends")
    for module, targets in edges.items():
        if module.startswith(f"hvd_magic.{folder}"):
            assert not {t for t in targets if t.startswith(below)}, module


def test_the_front_doors_have_one_room():
    """What a person types or calls (magics, HorovodRunner, their options) lives in frontends/,
    not loose beside the API and the shared modules."""
    top = {m for m in modules() if m.count(".") == 1}
    assert top.isdisjoint({f"hvd_magic.{n}" for n in (
        "magics", "cells", "session_magic", "tensorboard_magic", "horovod_runner", "options")})
    assert "hvd_magic.frontends.magics" in modules()


def test_the_data_room_is_below_the_launchers():
    """data/ plans a DataFrame for the ranks; the launchers call it, never the other way."""
    edges = internal_edges()
    for module, targets in edges.items():
        if module.startswith("hvd_magic.data"):
            assert not {t for t in targets if t.startswith(("hvd_magic.launch", "hvd_magic.driver"))}, module
        if module.startswith("hvd_magic.launch"):
            assert not module.endswith(("frames", "parquet", "dataplan", "datacache")), module


def test_the_frameworks_room_is_below_the_launchers():
    """frameworks/ says what a rank's environment and rendezvous are, framework by framework; the
    tasks and launchers ask it, never the other way, and it needs nothing of the notebook."""
    edges = internal_edges()
    for module, targets in edges.items():
        if module.startswith("hvd_magic.frameworks"):
            assert not {t for t in targets if t.startswith((
                "hvd_magic.launch", "hvd_magic.driver", "hvd_magic.view", "hvd_magic.frontends"))}, module
            bad = [n for n in imports(module, modules()[module])
                   if n.split(".")[0] in NOTEBOOK_SIDE]
            assert bad == [], module


def test_tasks_never_import_the_notebooks_packages():
    mods = modules()
    for module, rel in mods.items():
        if module.startswith("hvd_magic.task"):
            bad = [n for n in imports(module, rel) if n.split(".")[0] in ("IPython", "ipywidgets")]
            assert bad == [], module


def test_no_room_too_big():
    too_big = []
    for module, rel in modules().items():
        source = open(os.path.join(PACKAGE, rel)).read()
        if source.count("\n") > 400:
            too_big.append(f"{module}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and \
                    node.end_lineno - node.lineno + 1 > 250:
                too_big.append(f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert too_big == []


# What `%load_ext hvd_magic` and a driver-only run (cells, `run`, scripts, sessions, the
# TorchDistributor's local mode) load before anything asks for Spark.
DRIVER_ONLY_PATH = ("hvd_magic", "hvd_magic.frontends.magics", "hvd_magic.frontends.terminal",
                    "hvd_magic.frontends.distributors", "hvd_magic.frontends.session_magic",
                    "hvd_magic.api", "hvd_magic.launch", "hvd_magic.launch.local",
                    "hvd_magic.driver.run", "hvd_magic.driver.session", "hvd_magic.task.runner")


def test_the_driver_only_path_imports_nothing_of_spark_at_its_top():
    """A --np -N run needs neither pyspark nor Java (tests/test_anywhere.py runs one where
    pyspark is not installed): no module on its path imports pyspark or py4j at its top; what
    needs them imports them where it is used."""
    mods = modules()
    top = internal_edges(top_level_only=True)
    loaded = set()
    for start in DRIVER_ONLY_PATH:
        loaded |= reachable(start, top)
    assert {"hvd_magic.launch.local", "hvd_magic.task.runner", "hvd_magic.capture.cell"} <= loaded
    bad = {m: n for m in loaded for n in imports(m, mods[m], top_level_only=True)
           if n.split(".")[0] in ("pyspark", "py4j")}
    assert bad == {}


def test_no_module_imports_horovod_at_its_top():
    """Horovod is optional (hvd_magic.needs): only what uses it imports it, where it is used."""
    mods = modules()
    bad = {m: n for m, rel in mods.items() for n in imports(m, rel, top_level_only=True)
           if n.split(".")[0] == "horovod"}
    assert bad == {}


def test_compat_modules_are_leaves():
    """compat/ holds other libraries' private APIs, one module per library; it imports nothing
    of ours but its own package's notice (`hvd_magic.compat`), so any module may use it."""
    edges = internal_edges()
    for module, targets in edges.items():
        if module.startswith("hvd_magic.compat."):
            assert targets <= {"hvd_magic.compat"}, module


# The outside libraries whose private names only compat/ may read.
OUTSIDE = ("torch", "tensorflow", "keras", "pyspark", "py4j", "ipykernel", "IPython", "ipywidgets",
           "cloudpickle", "importlib", "horovod", "lightning", "pytorch_lightning", "accelerate",
           "mlflow", "comm", "tqdm")
# Internal modules: a library's private namespace, though no part of the path starts with "_".
INTERNAL_MODULES = ("tensorflow.python", "tensorflow.tsl", "tensorflow.core", "keras.src",
                    "tf_keras.src")
# Private names that are no library's internals: Python's documented sys functions, os._exit,
# and a Scala tuple's fields read through py4j.
# Public names with a leading underscore: the standard library's, and IPython's display
# protocol (``_repr_mimebundle_``, which every displayable object, ipywidgets' too, offers).
NOT_PRIVATE = {"_getframe", "_current_frames", "_exit", "_1", "_2", "_repr_mimebundle_",
               "_repr_html_", "_ipython_display_"}


def _own_private_names():
    """Every `_name` the package defines outside compat/: its functions, classes, variables,
    parameters, and the attributes its classes use on `self`/`cls` (not one it sets on another
    object: ``comm._reply_subshell_id = ...`` is ipykernel's name)."""
    names = set()
    for rel in modules().values():
        if rel.startswith("compat/"):
            continue
        for node in ast.walk(ast.parse(open(os.path.join(PACKAGE, rel)).read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in ("self", "cls"):
                names.add(node.attr)
    return {n for n in names if n.startswith("_")}


def _outside_bindings(tree):
    """The local names a module binds to an outside library (``import torch.distributed as
    dist``, ``from pyspark import SparkContext``)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names
                      if a.name.split(".")[0] in OUTSIDE}
        elif isinstance(node, ast.ImportFrom) and not node.level and \
                (node.module or "").split(".")[0] in OUTSIDE:
            bound |= {a.asname or a.name for a in node.names}
    return bound


def _root(node):
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def private_uses(source, own):
    """(line, name) of each outside private name `source` reads: an attribute (or a
    getattr/hasattr/setattr of a string) that is no name of ours, or any `_name` read through
    an outside library's module or class; a `_name` imported from one; a ``_keyword=``; an
    internal module's name (imported, or written as a string for an import hook)."""
    tree = ast.parse(source)
    outside = _outside_bindings(tree)
    found = []
    for node in ast.walk(tree):
        name, through = None, None
        if isinstance(node, ast.Attribute):
            name, through = node.attr, _root(node.value)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr", "setattr", "delattr") and \
                len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            name, through = node.args[1].value, _root(node.args[0])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                node.value.startswith(INTERNAL_MODULES):
            found.append((node.lineno, node.value))
            continue
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
            named = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names]
            found += [(node.lineno, n) for n in named if n.startswith(INTERNAL_MODULES)]
            if not isinstance(node, ast.ImportFrom) or named[0].split(".")[0] not in OUTSIDE:
                continue
            parts = (node.module or "").split(".") + [a.name for a in node.names]
            found += [(node.lineno, p) for p in parts if p.startswith("_") and p != "__future__"]
            continue
        if isinstance(node, ast.Call):  # a ``_keyword=`` of an outside call
            found += [(node.lineno, k.arg) for k in node.keywords if k.arg and
                      k.arg.startswith("_") and not k.arg.startswith("__") and
                      (k.arg not in own or _root(node.func) in outside)]
        if not isinstance(name, str) or not name.startswith("_") or name.startswith("__") or \
                name.startswith("_hvd_magic") or name in NOT_PRIVATE:
            continue
        if name not in own or through in outside:
            found.append((node.lineno, name))
    return found


def test_other_libraries_private_names_are_read_only_in_compat():
    """A private name of torch, pyspark, ipykernel... read anywhere else is a feature that stops
    in silence when that library changes: it goes through its compat/ module, feature-detected,
    said once when off."""
    own = _own_private_names()
    bad = []
    for module, rel in sorted(modules().items()):
        if not rel.startswith("compat/"):
            source = open(os.path.join(PACKAGE, rel)).read()
            bad += [f"{rel}:{line}: {name}" for line, name in private_uses(source, own)]
    assert bad == []


@pytest.mark.parametrize("line", [
    "import torch.distributed as dist\ndist.distributed_c10d._world.group_count = 0",
    "from pyspark import SparkContext\nSparkContext._active_spark_context",
    "def f(sc):\n    return sc._jsc.sc()",
    "def f(kernel):\n    return getattr(kernel, '_publish_status', None)",
    "from mlflow.tracking.fluent import _get_experiment_id",
    "import torch\ntorch._C._distributed_c10d",
    "from pyspark import SparkConf\nSparkConf(_jconf=None)",
    "from tensorflow.python.eager import polymorphic_function",
    "hooks.when_imported('keras.src.callbacks.callback_list', patch)",
])
def test_the_private_name_rule_catches(line):
    assert private_uses(line, own={"_world"}) != []


@pytest.mark.parametrize("line", [
    "class A:\n    def f(self, other):\n        return self._x + other._x",
    "import sys\nsys._getframe(0)",
    "def f(t):\n    return t.__dict__",
])
def test_the_private_name_rule_lets_ours_be(line):
    assert private_uses(line, own={"_x"}) == []
