"""A failing rank's frames with their locals, for the notebook's ``%debug`` (post-mortem).

`capture(tb)` turns the traceback of the exception a rank's code raised into plain JSON: each
frame's file, line, function and source line, and its locals as the rank had them. The record
travels in ``error.json`` (or a warm session's ``exit`` event: the event channel, which the driver
never unpickles), so a value goes either as itself (small JSON values: numbers, short strings,
small lists and dicts of them) or as a bounded repr (``reprlib``; tensors and arrays as shape,
dtype and a few values). The sources of the user's files (a cell's, a script's) go along, for
pdb's ``list``. The driver side rebuilds real frames from it: `hvd_magic.driver.postmortem`.

Also which frames are the user's own (`is_users`: not the standard library's, an installed
package's or hvd_magic's), decided here, where the paths are the rank's.
"""

import json
import linecache
import os
import reprlib
import sysconfig


MAX_FRAMES = 40            # the innermost ones
LOCALS_PER_FRAME = 40
SMALL_JSON = 2000          # characters a value may take as itself
SOURCE_MAX = 256 * 1024    # characters of one file's source sent along
SOURCES_MAX = 1024 * 1024

_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hvd_magic/
_NOT_USERS = tuple(p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib",
                                                                      "purelib", "platlib")}
                   if p) + (_OWN + os.sep,)


def is_users(filename):
    """True for a frame of the user's own code: a cell, a script, a module beside them."""
    if filename.startswith("<hvd_magic cell"):
        return True
    if filename.startswith("<") or "site-packages" in filename or "dist-packages" in filename:
        return False
    return not filename.startswith(_NOT_USERS)


def frame_record(filename, lineno, name, text=None):
    """[file, line, function, source line, user's?]: one frame as the stacks carry it."""
    if text is None:
        text = linecache.getline(filename, lineno).strip()
    return [filename, lineno, name, text, is_users(filename)]


_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 160
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8
_repr.maxlevel = 3


def _array_repr(value):
    """``Tensor(shape=(64, 10), dtype=torch.float32, [0.1, 0.2, ...])``, or None if no array."""
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None or callable(shape):
        return None
    if "cpu" not in str(getattr(value, "device", "cpu")).lower():
        # a GPU tensor's values would wait for its stream, maybe behind a hung collective
        return f"{type(value).__name__}(shape={tuple(shape)}, dtype={dtype}, device={value.device})"
    try:
        count = 1
        for n in shape:
            count *= int(n)
        firsts = value.reshape(-1)[:4].tolist()
        more = ", ..." if count > 4 else ""
        values = f", [{', '.join(_repr.repr(x) for x in firsts)}{more}]"
    except Exception:  # noqa: BLE001  (an array type we do not know: shape and dtype are enough)
        values = ""
    return f"{type(value).__name__}(shape={tuple(shape)}, dtype={dtype}{values})"


def _scalar(value):
    return value is None or isinstance(value, (bool, int, float)) or \
        (isinstance(value, str) and len(value) <= SMALL_JSON // 10)


def _small(value):
    """A value that can travel as itself: a scalar, a short string, or up to 50 of them in a
    list, tuple or str-keyed dict (checked before any encoding: a local may be huge)."""
    if isinstance(value, (list, tuple)):
        return len(value) <= 50 and all(_scalar(v) for v in value)
    if isinstance(value, dict):
        return len(value) <= 50 and all(isinstance(k, str) and _scalar(v)
                                        for k, v in value.items())
    return _scalar(value)


def bounded(value):
    """["v", value] for a small JSON value, ["t", [...]] for a small tuple, ["r", text] for
    anything else (never raises)."""
    try:
        if _small(value) and json.loads(json.dumps(value)) == (
                list(value) if isinstance(value, tuple) else value):
            return ["t", list(value)] if isinstance(value, tuple) else ["v", value]
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        text = _array_repr(value) or _repr.repr(value)
    except Exception as exc:  # noqa: BLE001  (a user's __repr__ may raise anything)
        text = f"<{type(value).__name__}: repr failed: {type(exc).__name__}>"
    return ["r", text]


def bounded_locals(scope, limit=LOCALS_PER_FRAME):
    """A frame's locals, each `bounded`; dunder names left out, at most `limit`."""
    names = [n for n in scope if not (n.startswith("__") and n.endswith("__"))][:limit]
    return {n: bounded(scope[n]) for n in names}


def capture(tb):
    """{"frames": [[file, line, function, text, user's?, locals], ...] (outermost first),
    "sources": {file: text}} for a traceback."""
    chain = []
    while tb is not None:
        chain.append(tb)
        tb = tb.tb_next
    frames, sources, total = [], {}, 0
    for entry in chain[-MAX_FRAMES:]:
        code = entry.tb_frame.f_code
        record = frame_record(code.co_filename, entry.tb_lineno, code.co_name)
        record.append(bounded_locals(entry.tb_frame.f_locals))
        frames.append(record)
        if record[4] and code.co_filename not in sources:
            text = "".join(linecache.getlines(code.co_filename))[:SOURCE_MAX]
            if text and total + len(text) <= SOURCES_MAX:
                sources[code.co_filename] = text
                total += len(text)
    return {"frames": frames, "sources": sources}
