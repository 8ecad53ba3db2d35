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
import os
import pickletools
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
    module = sys.modules.get(top)
    path = getattr(module, "__file__", None)
    if not path:
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


def names_in_pickle(data):
    """Modules whose globals a pickle refers to (what unpickling it will import)."""
    names, strings = set(), []
    for opcode, arg, _ in pickletools.genops(data):
        if opcode.name in ("GLOBAL", "INST"):
            names.add(str(arg).split(" ")[0])
        elif opcode.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            strings.append(arg)
        elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
            names.add(strings[-2])
    return names


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
