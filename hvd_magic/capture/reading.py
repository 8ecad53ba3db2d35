"""One reading of what a job needs, from its code: what it imports and which distributed APIs it
uses, read once, for every decision a launch makes (the elastic kind, what needs Horovod, what
the ranks' template holds).

It reads code, never text: a function's source parsed (a cell's, a script's and the shipped
modules' always have one; a function's is the ``def`` in its file), its bytecode only where no
source is found; the values a cell or a call passes (a function among them is read too, and the
notebook's functions it calls), and the globals a pickle names. Comments, docstrings and string
constants say nothing here: a helper module whose docstring mentions horovod, or a function
holding the string ``"horovod"``, uses no Horovod.

The bytecode is read by opcode family (`dis.haslocal`, `dis.hasfree`, `dis.hasname`), never by
opcode name: each Python renames and fuses them (3.12's ``LOAD_FAST_CHECK``, 3.13's
``LOAD_FAST_LOAD_FAST`` whose argument is a pair of names, 3.14's ``LOAD_FAST_BORROW``).

A name is what the code reaches: ``hvd.elastic.run`` where ``hvd`` is ``horovod.torch`` reads as
``horovod.torch.elastic.run``; ``from hvd_magic import elastic`` as ``hvd_magic.elastic``.

Not for: which of the notebook's modules travel (`capture.modules`, which reads more widely:
a name too many there costs a look-up).
"""

import ast
import builtins
import dis
import linecache
import os
import re
import sys
import types
from dataclasses import dataclass

from .modules import _installed_roots, _is_under, scan_pickle

_VARIABLES = frozenset(dis.haslocal) | frozenset(dis.hasfree)
_VERB = re.compile(r"(?:^|_)(LOAD|STORE|DELETE)_")


@dataclass(frozen=True)
class JobReading:
    """What a job's code reaches: `names` (dotted, as above), and `modules`, what its import
    statements name (``from a import b``: ``a`` and ``a.b``), the modules of the values it is
    given and of the globals its pickles name."""
    names: frozenset = frozenset()
    modules: frozenset = frozenset()

    @property
    def imports(self):
        """Every module the job imports, with its packages (``horovod.torch`` gives ``horovod``
        too)."""
        found = set()
        for name in self.modules:
            parts = name.split(".")
            found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        return found

    def uses(self, prefix):
        """Whether the job reaches `prefix` (a module, or a name in one)."""
        return any(n == prefix or n.startswith(prefix + ".") for n in self.names)

    @property
    def horovod(self):
        return self.uses("horovod")

    @property
    def horovod_elastic(self):
        """Horovod's elastic API: ``hvd.elastic.run``, ``horovod.torch.elastic``..."""
        return any(n.startswith("horovod.") and ".elastic" in f"{n}." for n in self.names)

    @property
    def ours_elastic(self):
        """`hvd_magic.elastic`: elastic torch.distributed without Horovod."""
        return self.uses("hvd_magic.elastic")


def read_job(code=None, values=None, sources=None, pickles=()):
    """The `JobReading` of a job: its function or code object `code` (a cell's function, or
    the function given to `run`), the `values` it is called with ({name: value}: a cell's
    notebook values), the `sources` it ships ({filename: text}: a script, the notebook's
    modules) and its `pickles` (bytes: the globals they name)."""
    reader = _Reader(values or {})
    if code is not None:
        reader.function(code)
    for value in (values or {}).values():
        reader.value(value)
    for filename, source in (sources or {}).items():
        try:
            tree = ast.parse(source, filename)
        except (SyntaxError, ValueError):  # not Python after all (a data file): nothing to read
            continue
        reader.tree(tree, {})
    for data in pickles:
        found = scan_pickle(getattr(data, "head", data)).globals
        reader.names.update(found)
        reader.modules.update(name.rsplit(".", 1)[0] for name in found)
    return JobReading(frozenset(reader.names), frozenset(reader.modules))


class _Reader:
    def __init__(self, values):
        self.values = values
        self.names, self.modules = set(), set()
        self._seen = set()
        self._installed = _installed_roots()  # (once a reading, not once a function)
        self._trees = {}  # a file's parsed source, once a reading

    def value(self, value):
        """What a value passed to the job brings: a module's name, a function's code, a class's
        or an object's module."""
        if isinstance(value, types.ModuleType):
            self.names.add(value.__name__)
            self.modules.add(value.__name__)
        elif isinstance(value, (types.FunctionType, types.MethodType, staticmethod, classmethod)):
            self.function(value)
        else:
            module = getattr(type(value) if not isinstance(value, type) else value, "__module__",
                             None)
            if isinstance(module, str) and module not in ("builtins", "__main__"):
                self.names.add(module)
                self.modules.add(module)

    def function(self, fn):
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", fn)
        if not isinstance(code, types.CodeType) or id(code) in self._seen:
            return
        self._seen.add(id(code))
        known = dict(self.values)
        known.update(getattr(fn, "__globals__", {}))
        cells = getattr(fn, "__closure__", None) or ()
        for name, cell in zip(code.co_freevars, cells):
            try:
                known[name] = cell.cell_contents
            except ValueError:  # an empty cell
                pass
        node = source_of(code, self._trees)
        if node is not None:
            self.tree(node, known)
        else:
            self.code(code, known)

    def tree(self, node, known):
        """Read the source `node` (a module's, or a function's ``def``) and what it nests: its
        imports, and the dotted names its names and attribute chains reach from what `known`
        or its imports bind (anywhere in it: one namespace for the whole of it)."""
        bound = {}
        imports = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
        for statement in imports:
            if isinstance(statement, ast.ImportFrom):
                if statement.level:  # (a package's own relative import: nothing of ours)
                    continue
                module = statement.module
                self._imported(module)
                for alias in statement.names:
                    if alias.name != "*":
                        self._imported(f"{module}.{alias.name}")
                        bound[alias.asname or alias.name] = f"{module}.{alias.name}"
                continue
            for alias in statement.names:
                self._imported(alias.name)
                bound[alias.asname or alias.name.split(".")[0]] = \
                    alias.name if alias.asname else alias.name.split(".")[0]
        chained = set()  # the inner attributes of a chain, read with its outermost
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and id(sub) not in chained:
                attrs, base = [], sub
                while isinstance(base, ast.Attribute):
                    chained.add(id(base))
                    attrs.append(base.attr)
                    base = base.value
                if isinstance(base, ast.Name):
                    chained.add(id(base))
                    root = self._root(base.id, bound, known)
                    if root is not None:
                        self.names.add(".".join([root, *reversed(attrs)]))
            elif isinstance(sub, ast.Name) and id(sub) not in chained and \
                    isinstance(sub.ctx, ast.Load):
                root = self._root(sub.id, bound, known)
                if root is not None:
                    self.names.add(root)

    def _imported(self, module):
        self.names.add(module)
        self.modules.add(module)

    def code(self, code, known, outer=None):
        """Read `code` and the code nested in it: its imports, and the dotted names its loads
        reach from what `known` ({name: value}), its own imports or its `outer` code's bind."""
        bound = dict(outer or {})
        instructions = list(dis.get_instructions(code))
        for i, ins in enumerate(instructions):
            if ins.opname == "IMPORT_NAME":
                self._import(instructions, i, bound)
            elif _variables(ins, "LOAD"):
                root = self._root(_variables(ins, "LOAD")[-1], bound, known)  # (the last: on top)
                if root is not None:
                    j, chain = i + 1, root
                    while j < len(instructions) and _attribute(instructions[j]):
                        chain += "." + instructions[j].argval
                        j += 1
                    self.names.add(chain)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self.code(const, known, bound)

    def _import(self, instructions, i, bound):
        """``import a.b``, ``import a.b as c``, ``from a import b as c, d``: the names read, and
        what the statement binds (``a``; ``c`` to ``a.b``; ``c`` to ``a.b`` and ``d`` to ``a.d``)."""
        module = instructions[i].argval
        self.names.add(module)
        self.modules.add(module)
        from_list = i > 0 and instructions[i - 1].opname == "LOAD_CONST" and \
            instructions[i - 1].argval is not None
        current = None
        for ins in instructions[i + 1:]:
            if ins.opname == "IMPORT_FROM":  # (`import a.b as c` walks a's attributes to b)
                current = f"{module}.{ins.argval}" if from_list else module
                self.names.add(current)
                self.modules.add(current)
            elif _variables(ins, "STORE"):
                bound[_variables(ins, "STORE")[0]] = current or module.split(".")[0]
                current = None
                if not from_list:
                    return
            else:  # (a from-import's POP_TOP, or the next statement)
                return

    def _own(self, module):
        """Whether `module` is the user's code (the notebook, a script, a module beside them),
        not an installed library's, whose code is not ours to read."""
        if module in (None, "__main__"):
            return True
        path = getattr(sys.modules.get(module), "__file__", None)
        return bool(path) and not any(_is_under(os.path.realpath(path), root)
                                      for root in self._installed)

    def _root(self, name, bound, known):
        """The dotted name `name` stands for, or None: a module or what a module defines."""
        if name in bound:
            return bound[name]
        if name not in known or hasattr(builtins, name) and known[name] is getattr(builtins, name):
            return None
        value = known[name]
        if isinstance(value, types.ModuleType):
            return value.__name__
        if isinstance(value, (types.FunctionType, type)):
            module = getattr(value, "__module__", None)
            if isinstance(value, types.FunctionType) and self._own(module):
                self.function(value)  # the notebook's (or its modules') code: what it uses too
            return f"{module}.{getattr(value, '__qualname__', name)}" if module else None
        return None


def _variables(ins, verb):
    """The variables instruction `ins` loads (`verb` "LOAD") or stores ("STORE"), in order: a
    local's, a cell's, a global's or a name's, one or a fused pair (``STORE_FAST_LOAD_FAST``)."""
    if "CLOSURE" in ins.opname or ins.opcode not in _VARIABLES and not (
            ins.opcode in dis.hasname and ("GLOBAL" in ins.opname or "NAME" in ins.opname)
            and "IMPORT" not in ins.opname and "ATTR" not in ins.opname):
        return ()
    verbs = _VERB.findall(ins.opname)
    names = ins.argval if isinstance(ins.argval, tuple) else (ins.argval,)
    if len(names) != len(verbs):
        return ()
    return tuple(n for v, n in zip(verbs, names) if v == verb and isinstance(n, str))


def _attribute(ins):
    """Whether `ins` reads an attribute of what is on top (``LOAD_ATTR``, ``LOAD_METHOD``)."""
    return ins.opcode in dis.hasname and ins.opname.startswith("LOAD_") and \
        ("ATTR" in ins.opname or "METHOD" in ins.opname) and "SUPER" not in ins.opname


def source_of(code, trees=None):
    """The source of `code`, parsed, where its file's lines are known (`linecache`: a cell's,
    a script's, a module's on disk): the whole of it for a module's (or a cell's) code, the
    ``def`` or ``lambda`` that made a function's. None where none is found. `trees`: the files
    parsed so far ({filename: tree or None}), filled in."""
    trees = {} if trees is None else trees
    if code.co_filename not in trees:
        try:
            trees[code.co_filename] = ast.parse("".join(linecache.getlines(code.co_filename)),
                                                code.co_filename)
        except (SyntaxError, ValueError):
            trees[code.co_filename] = None
    tree = trees[code.co_filename]
    if tree is None or not tree.body:
        return None
    if code.co_name == "<module>":
        return tree
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                node.name == code.co_name and \
                min([node.lineno] + [d.lineno for d in node.decorator_list]) == \
                code.co_firstlineno:
            return node
        if isinstance(node, ast.Lambda) and code.co_name == "<lambda>" and \
                node.lineno == code.co_firstlineno:
            return node
    return None
