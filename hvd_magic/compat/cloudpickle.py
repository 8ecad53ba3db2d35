"""cloudpickle's reduction of a code object, given back the code's file name.

cloudpickle >= 3.1.3 pickles every code object with the file name ``<dynamic-code>`` (for
pickles that do not depend on where a function was defined); a rank's traceback would lose the
cell's lines, which it finds by ``<hvd_magic cell N>``, the file name a cell is compiled with.
The reduction is cloudpickle's own (its pickler's dispatch table, not a public API): it is
probed once with a code object of a known name, and where it has neither that name nor the
placeholder, cloudpickle's pickler is used as it is, said once.

Imported where cloudpickle is (every pickle of ours, `hvd_magic.payload`).
"""

import functools
import types

from . import unavailable

PLACEHOLDER = "<dynamic-code>"
_PROBE = "<hvd_magic probe>"


@functools.lru_cache(maxsize=None)
def code_naming_pickler():
    """A `cloudpickle.Pickler` whose code objects keep their file names (cloudpickle's own
    where this cloudpickle's reduction cannot be read)."""
    import cloudpickle

    reduce_code = getattr(cloudpickle.Pickler, "dispatch_table", {}).get(types.CodeType)
    args = reduce_code(compile("0", _PROBE, "eval"))[1] if reduce_code is not None else ()
    if _PROBE in args:  # (before 3.1.3: the name kept)
        return cloudpickle.Pickler
    if PLACEHOLDER not in args:
        unavailable("cloudpickle", "code objects' file names in a pickle",
                    "a rank's traceback does not show the cell's lines")
        return cloudpickle.Pickler

    class CodeNamingPickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if type(obj) is types.CodeType:
                make, args = reduce_code(obj)
                return make, tuple(obj.co_filename if a == PLACEHOLDER else a for a in args)
            return super().reducer_override(obj)

    return CodeNamingPickler
