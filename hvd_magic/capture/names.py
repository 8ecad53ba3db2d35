"""Which names a cell reads from outside itself: the notebook values (or, in a warm session, the
ranks' names) that it needs.

Python's own `symtable` says which names the cell's code reads as globals, in any scope it
defines; the cell's statements, walked in order, say which of its own names it may read before
it binds them (``x = x + 1``, a loop's first pass, one branch of an ``if``): those come from
outside too.

Not for: what is done with those names (`hvd_magic.capture.cell` passes them as arguments,
`hvd_magic.capture.session` takes the notebook's current values), or what a job imports
(`hvd_magic.capture.reading`).
"""

import ast
import symtable
import sys


def _scope_globals(table):
    """Names read as globals anywhere in this scope or the scopes nested in it."""
    names = {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
    for child in table.get_children():
        names |= _scope_globals(child)
    return names


def _loads(node):
    """Names loaded by a statement, not counting the bodies of functions and lambdas it defines."""
    found = []

    def walk(n):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for d in n.decorator_list + n.args.defaults + [x for x in n.args.kw_defaults if x]:
                walk(d)
            return
        if isinstance(n, ast.Lambda):
            for d in n.args.defaults:
                walk(d)
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            found.append(n.id)
        if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            found.append(n.target.id)
        for child in ast.iter_child_nodes(n):
            walk(child)

    walk(node)
    return found


def _stores(node):
    """Names a simple statement binds for certain."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    targets = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and getattr(node, "value", None):
        targets = [node.target]
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        targets = [i.optional_vars for i in node.items if i.optional_vars is not None]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _read_before_bound(stmts, bound, out):
    """Add to `out` the names some statement may read before the cell has bound them."""
    for stmt in stmts:
        if isinstance(stmt, (ast.For, ast.AsyncFor)):
            out.update(n for n in _loads(stmt.iter) if n not in bound)
            inner = bound | {n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)}
            _read_before_bound(stmt.body, set(inner), out)
            _read_before_bound(stmt.orelse, set(bound), out)
        elif isinstance(stmt, (ast.If, ast.While)):
            out.update(n for n in _loads(stmt.test) if n not in bound)
            _read_before_bound(stmt.body, set(bound), out)
            _read_before_bound(stmt.orelse, set(bound), out)
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                out.update(n for n in _loads(item.context_expr) if n not in bound)
            bound |= _stores(stmt)
            _read_before_bound(stmt.body, bound, out)
        elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            _read_before_bound(stmt.body, set(bound), out)
            for handler in stmt.handlers:
                if handler.type is not None:
                    out.update(n for n in _loads(handler.type) if n not in bound)
                _read_before_bound(handler.body, set(bound), out)
            _read_before_bound(stmt.orelse, set(bound), out)
            _read_before_bound(stmt.finalbody, bound, out)
        elif type(stmt).__name__ == "Match":
            out.update(n for n in _loads(stmt.subject) if n not in bound)
            for case in stmt.cases:
                _read_before_bound(case.body, set(bound), out)
                if case.guard is not None:
                    out.update(n for n in _loads(case.guard) if n not in bound)
        else:
            out.update(n for n in _loads(stmt) if n not in bound)
            bound |= _stores(stmt)
    return out


def names_read(tree):
    """Names the cell may read from outside itself: its globals, and locals read before bound."""
    fn_def = function_def("__cell__", [], tree.body or [ast.Pass()])
    fn_def.lineno = fn_def.col_offset = 0
    wrapper = ast.fix_missing_locations(ast.Module(body=[fn_def], type_ignores=[]))
    table = symtable.symtable(ast.unparse(wrapper), "<cell>", "exec").get_children()[0]
    cell_locals = {s.get_name() for s in table.get_symbols() if s.is_local()}
    free = _scope_globals(table)
    early = _read_before_bound(tree.body, set(), set())
    return free | (early & cell_locals)


def function_def(name, arg_names, body):
    """``def name(arg_names): body`` as an AST node, for this Python's ast."""
    extra = {"type_params": []} if sys.version_info >= (3, 12) else {}
    return ast.FunctionDef(
        name=name, args=ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in arg_names],
                                      kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=body, decorator_list=[], returns=None, **extra)
