"""The notebook's own modules, shipped with the job: ``import mylib`` on a rank whose machine
cannot see the notebook's folder.

A module is the notebook's own when its file is under the notebook's folder and not part of an
installed environment (site-packages, the interpreter's prefix): ``mylib.py`` or a package folder
beside the notebook. Which ones a job needs is read from what it will import, nothing else: the
modules its pickles name (`pickletools`: every global the unpickler will look up, e.g. a function
of ``mylib`` that cloudpickle pickled by reference, an instance of one of its classes), the
import lines a cell gets, and the ``import`` statements in the function's own code; then, from their sources, the local modules those import in turn. Their
``.py`` files travel in the job (a package: all of its ``.py`` files) and the rank puts them first
on its ``sys.path`` (`hvd_magic.rank.__main__.install_modules`).
"""

import ast
import dis
import io
import os
import pickletools
import re
import struct
import site
import sys
import sysconfig

MAX_BYTES = 20 * 1024 * 1024   # a "local module" larger than this is data, not code: not shipped


def _installed_roots():
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    roots.update(site.getsitepackages() + [site.getusersitepackages()])
    roots.update(p for p in sysconfig.get_paths().values() if p)
    return [os.path.realpath(r) for r in roots if r]


def _is_under(path, root):
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _local_root(name, folder, installed):
    """(top-level module, its path) when `name`'s top-level package is the notebook's own."""
    top = name.split(".")[0]
    if top == __name__.split(".")[0]:  # hvd_magic itself (a checkout beside the notebook): the
        return None                    # rank runs its own copy, the one it started with
    if top == "__main__":  # the script or the notebook itself: what it defines travels by value
        return None
    module = sys.modules.get(top)
    path = getattr(module, "__file__", None)
    # A pseudo-file (`python -` gives '<stdin>', exec'd code '<string>', IPython
    # '<ipython-input-...>') names no source to ship.
    if not path or not os.path.isfile(path):
        return None
    path = os.path.realpath(path)
    if not _is_under(path, folder) or any(_is_under(path, r) for r in installed):
        return None
    return top, path


def _files(path):
    """{path relative to the notebook's folder: source} of a module or a whole package."""
    if os.path.basename(path) == "__init__.py":
        package = os.path.dirname(path)
        found = {}
        for here, _, names in os.walk(package):
            for name in names:
                if name.endswith(".py"):
                    full = os.path.join(here, name)
                    found[os.path.relpath(full, os.path.dirname(package))] = full
        return found
    return {os.path.basename(path): path}


def _imported_names(source):
    names = set()
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


# Opcodes whose argument is a length and then that many bytes: skipped without reading them, so
# that scanning a pickle of a 200 MB array costs no copy of it.
_SIZED = {b"B": "<I", b"X": "<I", b"\x8e": "<Q", b"\x96": "<Q", b"\x8d": "<Q", b"T": "<i", b"C": "<B"}
_CODES = {op.code.encode("latin-1"): op for op in pickletools.opcodes}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class PickleNames:
    """What a pickle names: `globals`, the "module.name" of every global the unpickler will look
    up (the module and name ``STACK_GLOBAL`` takes are the two strings pushed or fetched from
    the memo just before it), and `strings`, every short string in it that reads like a name."""

    def __init__(self):
        self.globals, self.strings = set(), set()


def scan_pickle(data):
    """The `PickleNames` of a pickle, its large byte and string values skipped unread (a 200 MB
    array's pickle costs no copy)."""
    stream = io.BytesIO(data)
    found, memo, recent = PickleNames(), {}, []
    while True:
        code = stream.read(1)
        op = _CODES.get(code)
        if op is None or op.name == "STOP":
            return found
        if code in _SIZED:
            fmt = _SIZED[code]
            (size,) = struct.unpack(fmt, stream.read(struct.calcsize(fmt)))
            stream.seek(size, io.SEEK_CUR)
            recent.append(None)
            continue
        arg = op.arg.reader(stream) if op.arg is not None else None
        if op.name in ("GLOBAL", "INST"):
            found.globals.add(str(arg).replace(" ", "."))
        elif op.name == "STACK_GLOBAL" and len(recent) >= 2 and None not in recent[-2:]:
            found.globals.add(f"{recent[-2]}.{recent[-1]}")
        elif op.name == "MEMOIZE":
            memo[len(memo)] = recent[-1] if recent else None
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            recent.append(memo.get(arg))
        elif op.name in ("BINPUT", "LONG_BINPUT", "PUT"):
            memo[arg] = recent[-1] if recent else None
        elif isinstance(arg, str):
            recent.append(arg)
            if len(arg) < 256 and _NAME.fullmatch(arg):
                found.strings.add(arg)
        else:
            recent.append(None)
        del recent[:-2]


def names_in_pickle(data):
    """Names of modules a pickle may import: the module of every global it refers to, and every
    short string in it that reads like a module name (a name too many only costs a check)."""
    found = scan_pickle(data)
    return {name.rsplit(".", 1)[0] for name in found.globals} | found.strings


def names_in_code(code):
    """Modules a function's (or a code object's) own `import` statements name, nested ones too."""
    code = getattr(code, "__code__", code)
    if not hasattr(code, "co_consts"):  # a callable object, a partial: its pickle tells the rest
        return set()
    names = set()
    for instruction in dis.get_instructions(code):
        if instruction.opname == "IMPORT_NAME":
            names.add(instruction.argval)
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            names |= names_in_code(const)
    return names


def identifiers(source):
    """Every name a module's or a cell's code uses (variables, attributes, imported names), not
    the words of its strings and comments; every word when it does not parse."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(re.findall(r"[A-Za-z_]\w*", source))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
    return names


def names_in_imports(lines):
    return _imported_names("\n".join(lines))


def local_sources(names, folder=None):
    """{relative path: source} of the notebook's own modules among `names`, with the local
    modules they import; {} when there are none."""
    folder = os.path.realpath(folder or os.getcwd())
    installed = _installed_roots()
    todo, seen, sources = list(names), set(), {}
    while todo:
        found = _local_root(todo.pop(), folder, installed)
        if found is None or found[0] in seen:
            continue
        seen.add(found[0])
        for rel, full in _files(found[1]).items():
            if os.path.getsize(full) > MAX_BYTES:
                continue
            with open(full, encoding="utf-8", errors="replace") as f:
                sources[rel] = f.read()
            todo.extend(_imported_names(sources[rel]))
    return sources


def script_modules(path, source):
    """{path relative to the script's folder: source} of the modules beside a script that it
    imports (a ``helpers.py``, a package folder), and the ones those import in turn: what
    ``python train.py`` finds through its folder on ``sys.path``, shipped to ranks whose machine
    does not see that folder. Unlike a notebook's modules they need not be imported here."""
    folder = os.path.dirname(os.path.realpath(path))
    todo, seen, sources = list(_imported_names(source)), set(), {}
    while todo:
        top = todo.pop().split(".")[0]
        if top in seen:
            continue
        seen.add(top)
        for candidate in (os.path.join(folder, top, "__init__.py"), os.path.join(folder, top + ".py")):
            if os.path.isfile(candidate):
                break
        else:
            continue
        for rel, full in _files(candidate).items():
            if os.path.getsize(full) > MAX_BYTES or os.path.realpath(full) == os.path.realpath(path):
                continue
            with open(full, encoding="utf-8", errors="replace") as f:
                sources[rel] = f.read()
            todo.extend(_imported_names(sources[rel]))
    return sources
