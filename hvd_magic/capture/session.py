"""A cell for a warm session: code that runs in each rank's own, lasting namespace.

Unlike a one-off cell (a function whose locals vanish), a session cell runs like a cell of a
kernel: its statements are compiled as a module and executed in the rank's namespace, so what it
assigns is there for the next cell. The notebook's imports it uses come first, as in a one-off
cell; the notebook values it reads travel with it, but a name that the ranks assigned in an
earlier cell wins over the notebook's value of the same name (`SessionCell.assigns` tells the
rank which names this cell assigns).

A function defined in a session cell lives on the ranks, but the notebook values it reads must be
the notebook's current ones when a later cell calls it, as in one process: `SessionCell.functions`
records the global names each function (or class) of the cell reads, the session keeps them, and
a later cell that uses such a function also takes, transitively, the notebook values those read
(less the names the ranks assigned themselves: `reads_through`).
"""

import ast
import dataclasses
import marshal

from .cell import parse_statement, prepare, semicolon_at_end, split_last_expression
from .names import names_read

VALUE_NAME = "__hvd_magic_value__"


@dataclasses.dataclass
class SessionCell:
    code: bytes                  # marshal of the compiled module (same Python on every rank)
    filename: str
    source: str
    values: dict                 # name -> notebook value
    assigns: tuple               # names the cell binds at its top level
    imports: list
    export: tuple = ()
    quiet: bool = False
    functions: dict = dataclasses.field(default_factory=dict)  # name -> global names it reads

    @property
    def sources(self):
        return {self.filename: self.source}


def top_level_stores(tree):
    """Names a module's statements bind in its own namespace (not inside functions or classes)."""
    names = set()

    class Stores(ast.NodeVisitor):
        def visit_FunctionDef(self, node):
            names.add(node.name)  # its body is another scope

        visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

        def visit_Lambda(self, node):
            pass

        def visit_ListComp(self, node):
            for generator in node.generators:  # only the first iterable is evaluated here
                self.visit(generator.iter)

        visit_SetComp = visit_GeneratorExp = visit_DictComp = visit_ListComp

        def visit_Name(self, node):
            if isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)

        def visit_alias(self, node):
            names.add((node.asname or node.name).split(".")[0])

        def visit_ExceptHandler(self, node):
            if node.name:
                names.add(node.name)
            self.generic_visit(node)

    Stores().visit(tree)
    return names


def function_reads(body):
    """{name: global names it reads} for each function and class a cell defines at its top level
    (its nested functions, lambdas and comprehensions included)."""
    return {stmt.name: tuple(sorted(names_read(ast.Module(body=[stmt], type_ignores=[]))))
            for stmt in body
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def reads_through(names, functions, assigned=()):
    """The global names that the session functions among `names` read, and the functions those
    read, and so on; less the names in `assigned` (the ranks' own values win over the notebook's)."""
    found, todo, seen = set(), [n for n in names if n in functions], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for read in functions[name]:
            found.add(read)
            if read in functions:
                todo.append(read)
    return found - set(assigned)


def capture_session_cell(cell, namespace, *, cell_id="0", first_line=1, export=(), hidden=(),
                         functions=None, assigned=()):
    """Make a `SessionCell` out of a cell's text and the notebook namespace it runs against.

    `functions` ({name: names it reads}, from earlier cells' `SessionCell.functions`) and
    `assigned` (names the ranks assigned) make the notebook values that the session's functions
    read travel with a cell that uses them."""
    functions = functions or {}
    filename, source, tree, imports, values = prepare(
        cell, namespace, cell_id=cell_id, first_line=first_line, hidden=hidden,
        also_read=lambda reads: reads_through(reads, functions, assigned))
    body, last, first = split_last_expression(tree)
    assigns = top_level_stores(ast.Module(body=body, type_ignores=[]))
    if last is not None:
        body.append(ast.copy_location(
            ast.Assign([ast.Name(VALUE_NAME, ast.Store())], last.value), last))
    header = [parse_statement(text, first) for text in imports]
    module = ast.fix_missing_locations(ast.Module(body=header + body, type_ignores=[]))
    code = compile(module, filename, "exec")
    return SessionCell(code=marshal.dumps(code), filename=filename, source=source, values=values,
                       assigns=tuple(sorted(assigns)), imports=imports, export=tuple(export),
                       quiet=semicolon_at_end(cell), functions=function_reads(body))
