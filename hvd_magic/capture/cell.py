"""Turn a notebook cell into a function that runs the same way on a rank.

The cell's text goes through IPython's own transforms (so ``!cmd`` lines work), is parsed once
(a `SyntaxError` points at the cell's own line), and is spliced into

    def cell(name_a, name_b, ...):        # notebook values the cell reads, passed by value
        import numpy as np                # notebook imports the cell uses, re-imported on the rank
        from math import sqrt
        ...the cell's statements...
        return <last expression>, <locals() if --export>

Modules are never pickled: a name bound to a module (or to an importable function or class of an
installed package) becomes an import statement at the top of the body. Every other notebook value
the cell reads is pickled on its own first, so that everything that cannot travel is named at once,
before any job starts.

Not for: launching, Spark, or showing anything.
"""

import ast
import builtins
import dataclasses
import linecache
import re
import sys
import types

from IPython.core.error import UsageError

from ..errors import cell_filename
from .names import function_def, names_read

CELL_FUNCTION = "__cell__"
_HIDDEN = re.compile(r"^(_+|_i{1,3}|_i?\d+|_[iod]h|In|Out|get_ipython|exit|quit)$")
_SHELL_CALLS = {"system": "_hvd_magic_system", "getoutput": "_hvd_magic_getoutput"}


@dataclasses.dataclass
class CellFunction:
    """A cell made into a function, with the notebook values it needs."""
    fn: types.FunctionType
    filename: str
    source: str
    values: dict                 # name -> notebook value, passed as keyword arguments
    imports: list                # the import statements put at the top of the body (as text)
    export: tuple = ()
    quiet: bool = False          # the cell ends with `;`: do not display its value

    @property
    def sources(self):
        return {self.filename: self.source}


def _ipython_transform(cell):
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager().transform_cell(cell)


def _is_get_ipython_call(node, method):
    """`get_ipython().<method>(...)`, which IPython's transforms write for ``!``, ``%`` and ``%%``."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == method and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "get_ipython")


def _check_statements(tree, lines):
    """Refuse what cannot be a function body, naming the line."""
    def line_of(node):
        text = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
        return f"line {node.lineno}: `{text}`"

    class Checker(ast.NodeVisitor):
        depth = 0

        def nested_scope(self, node):
            self.depth += 1
            super().generic_visit(node)
            self.depth -= 1

        visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = nested_scope

        def generic_visit(self, node):
            top = self.depth == 0
            if isinstance(node, (ast.Global, ast.Nonlocal)) and top:
                raise UsageError(
                    f"{line_of(node)}: `global`/`nonlocal` at the top of a %%horovod cell has no "
                    "meaning: the cell runs as a function on each rank, away from the notebook's "
                    "namespace. Use --export NAME to bring a value back instead.")
            if isinstance(node, ast.Return) and top:
                raise UsageError(f"{line_of(node)}: `return` outside a function. The cell's last "
                                 "expression is already its value; end the cell with it.")
            if isinstance(node, (ast.Yield, ast.YieldFrom)) and top:
                raise UsageError(f"{line_of(node)}: `yield` at the top of a %%horovod cell would "
                                 "turn the whole cell into a generator; put it inside a function.")
            if isinstance(node, (ast.Await, ast.AsyncFor, ast.AsyncWith)) and top:
                raise UsageError(f"{line_of(node)}: top-level `await` is not supported on the ranks;"
                                 " wrap the coroutine in asyncio.run(...).")
            for kind in ("run_line_magic", "run_cell_magic"):
                if _is_get_ipython_call(node, kind):
                    what = "line magic" if kind == "run_line_magic" else "cell magic"
                    raise UsageError(
                        f"{line_of(node)}: a {what} cannot run on the ranks (there is no IPython "
                        "there). Run it in its own cell, or use plain Python in this one.")
            super().generic_visit(node)

    Checker().visit(tree)


class _ShellCalls(ast.NodeTransformer):
    """``!cmd`` became `get_ipython().system('cmd')`; on a rank it runs `hvd_magic.shell.system`."""

    def __init__(self):
        self.used = set()

    def visit_Call(self, node):
        self.generic_visit(node)
        for method, local in _SHELL_CALLS.items():
            if _is_get_ipython_call(node, method):
                self.used.add(method)
                return ast.copy_location(
                    ast.Call(func=ast.Name(local, ast.Load()), args=node.args, keywords=node.keywords),
                    node)
        return node


# --- imports instead of pickles --------------------------------------------------------------

def _attribute_chains(tree, name):
    """Dotted paths used after `name` in the cell: ``xml.etree.ElementTree.parse`` -> [...]."""
    chains = set()
    for node in ast.walk(tree):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if parts and isinstance(node, ast.Name) and node.id == name:
            chains.add(tuple(reversed(parts)))
    return chains


def _module_imports(name, module, tree):
    statements = []
    modname = module.__name__
    if modname == name:
        statements.append(f"import {modname}")
    else:
        statements.append(f"import {modname} as {name}")
    # Submodules reached through the name (``os.path`` is loaded by ``os``; ``xml.etree`` is not).
    for chain in sorted(_attribute_chains(tree, name)):
        for i in range(1, len(chain) + 1):
            sub = ".".join((modname,) + chain[:i])
            if isinstance(sys.modules.get(sub), types.ModuleType):
                statements.append(f"__import__({sub!r})")
    return list(dict.fromkeys(statements))


def _importable_from(value):
    """``(module, attribute)`` when `value` is a function or class importable from a package."""
    module = getattr(value, "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return None
    if module in ("__main__", "builtins") or "." in qualname or "<" in qualname:
        return None
    if not isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType)):
        return None
    mod = sys.modules.get(module)
    if mod is None or getattr(mod, qualname, None) is not value:
        return None
    return module, qualname


def hidden_name(name):
    return bool(_HIDDEN.match(name))


# --- the function ----------------------------------------------------------------------------

def parse_statement(text, like):
    stmt = ast.parse(text).body[0]
    for node in ast.walk(stmt):
        ast.copy_location(node, like)
    return stmt


def semicolon_at_end(cell):
    try:
        from IPython.core.displayhook import DisplayHook
        return DisplayHook.semicolon_at_end_of_expression(cell)
    except (ImportError, AttributeError):
        return cell.rstrip().endswith(";")


def prepare(cell, namespace, *, cell_id="0", first_line=1, hidden=(), also_read=None):
    """What a cell is, whichever way it runs: its transformed source and tree (checked), the
    import lines for the notebook modules it uses, and the notebook values it reads
    (`also_read(names read)`, if given, adds names read elsewhere: a warm session's functions).

    `cell_id` is the cell's prompt number and `first_line` the editor's number of its first line
    (2 under a ``%%horovod`` line): tracebacks and messages then say the line the user sees. The
    source is padded with blank lines to start there, so its line numbers are the editor's."""
    filename = cell_filename(cell_id)
    source = "\n" * (first_line - 1) + _ipython_transform(cell)
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)  # a SyntaxError here names the cell's own line
    # IPython's transforms keep line numbers
    _check_statements(tree, [""] * (first_line - 1) + cell.splitlines())
    shell_calls = _ShellCalls()
    tree = shell_calls.visit(tree)

    reads = names_read(tree)
    if also_read is not None:
        reads |= also_read(reads)
    wanted = sorted(n for n in reads
                    if n in namespace and n not in hidden and not hidden_name(n))
    imports, values = [], {}
    for name in wanted:
        value = namespace[name]
        if isinstance(value, types.ModuleType):
            imports.extend(_module_imports(name, value, tree))
        elif (origin := _importable_from(value)) is not None:
            module, attr = origin
            imports.append(f"from {module} import {attr}" + (f" as {name}" if attr != name else ""))
        elif getattr(builtins, name, object()) is value:
            continue  # the notebook re-exported a builtin under its own name
        else:
            values[name] = value
    if shell_calls.used:
        imports.append("from hvd_magic.rank.shell import "
                       + ", ".join(f"{m} as {_SHELL_CALLS[m]}" for m in sorted(shell_calls.used)))
    return filename, source, tree, imports, values


def split_last_expression(tree):
    """(statements, the last expression or None, the first statement: where new lines go)."""
    body = list(tree.body)
    first = body[0] if body else ast.Pass(lineno=1, col_offset=0)
    if not body:
        body = [ast.copy_location(ast.Pass(), first)]
    if isinstance(body[-1], ast.Expr):
        return body[:-1], body[-1], first
    return body, None, first


def capture_cell(cell, namespace, *, cell_id="0", first_line=1, export=(), hidden=()):
    """Make a `CellFunction` out of a cell's text and the notebook namespace it runs against
    (`cell_id`, `first_line`: the cell's prompt number and first line, as `prepare` says)."""
    filename, source, tree, imports, values = prepare(cell, namespace, cell_id=cell_id,
                                                       first_line=first_line, hidden=hidden)
    body, last, first = split_last_expression(tree)
    value_expr = ast.Constant(None) if last is None else last.value
    exports_expr = (ast.Call(ast.Name("locals", ast.Load()), [], []) if export
                    else ast.Constant(None))
    ret = ast.copy_location(ast.Return(ast.Tuple([value_expr, exports_expr], ast.Load())),
                            last or (body[-1] if body else first))
    header = [parse_statement(text, first) for text in imports]
    fn_def = function_def(CELL_FUNCTION, list(values), header + body + [ret])
    ast.copy_location(fn_def, first)
    module = ast.fix_missing_locations(ast.Module(body=[fn_def], type_ignores=[]))
    namespace_for_fn = {"__builtins__": builtins, "__name__": "hvd_magic_cell"}
    exec(compile(module, filename, "exec"), namespace_for_fn)
    fn = namespace_for_fn[CELL_FUNCTION]
    # Its frame reads as a plain cell's does, in tracebacks and debuggers: ``<module>``.
    fn.__code__ = renamed(fn.__code__, "<module>")
    fn.__qualname__ = fn.__name__ = "cell"
    return CellFunction(fn=fn, filename=filename, source=source, values=values, imports=imports,
                        export=tuple(export), quiet=semicolon_at_end(cell))


def renamed(code, name):
    """`code` named `name` where tracebacks and debuggers read it: its ``co_name`` and, from
    Python 3.11, its ``co_qualname`` (which 3.10's ``code.replace`` does not take)."""
    if hasattr(code, "co_qualname"):
        return code.replace(co_name=name, co_qualname=name)
    return code.replace(co_name=name)
