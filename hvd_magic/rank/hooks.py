"""Run a function right after a module is imported, without importing it ourselves.

The rank bootstrap patches tqdm, Horovod and torch this way: a fresh rank process must not load
anything the cell itself does not import.
"""

import importlib.util
import sys


class _AfterImport:
    def __init__(self, name, callback):
        self.name = name
        self.callback = callback

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)  # find the real spec with the other finders, once
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_call(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_call
        return spec


def when_imported(name, callback):
    """Call `callback(module)` once `name` is imported (at once if it already is)."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


def replace(module, wrapped):
    """Put the `wrapped` functions ({name: wrapper}) in `module`, and in every module of its
    package that already took the originals by name (``from .mpi_ops import *``): in a fresh
    rank none has (each module is patched right after it loads, before its package imports
    from it), in a rank forked from a template that had loaded the framework (`hvd_magic.template`)
    all have."""
    originals = {id(getattr(module, name)): fn for name, fn in wrapped.items()}
    package = module.__name__.rpartition(".")[0] + "."  # (torch.distributed., horovod.torch.)
    for name, other in list(sys.modules.items()):
        if other is module or (name + ".").startswith(package):
            names = getattr(other, "__dict__", {})
            for attr, value in list(names.items()):
                if id(value) in originals and getattr(value, "__name__", None) == attr:
                    names[attr] = originals[id(value)]
