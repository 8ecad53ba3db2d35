"""The cell becomes a function: `capture_cell` (cell text -> `CellFunction`) and `pickle_values`
(the values it reads, each checked on its own). Driver side only: nothing here runs on a rank."""

from .cell import CellFunction, capture_cell, semicolon_at_end
from .values import pickle_values

__all__ = ["CellFunction", "capture_cell", "semicolon_at_end", "pickle_values"]
