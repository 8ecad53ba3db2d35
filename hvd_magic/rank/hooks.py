"""Run a function right after a module is imported, without importing it ourselves.

The rank bootstrap patches tqdm and Horovod this way: a fresh rank process must not load
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
