"""IPython's internals that the notebook side uses: the compiler's table of cell file names.

Imports nothing: it is handed the shell.
"""

from . import unavailable


def name_cell_file(shell, filename, count):
    """Have IPython show code compiled from `filename` as its own cells' (``Cell In[count]``),
    through its compiler's ``_filename_map``. False where this IPython has none: a SyntaxError
    in a rank's copy of the cell then names the file, not the cell."""
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if not isinstance(names, dict):
        unavailable("IPython", "the compiler's cell names (CachingCompiler._filename_map)",
                    "a SyntaxError in a cell's ranks names its file, not Cell In[N]")
        return False
    names[filename] = count
    return True
