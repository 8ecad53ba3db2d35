"""A failing rank's frames with their locals, for the notebook's ``%debug`` (post-mortem).

`capture(tb)` turns the traceback of the exception a rank's code raised into plain JSON: each
frame's file, line, function and source line, and its locals as the rank had them. The record
travels in ``error.json`` (or a warm session's ``exit`` event: the event channel, which the driver
never unpickles), so a value goes either as itself (small JSON values: numbers, short strings,
small lists and dicts of them) or as a bounded repr (``reprlib``; tensors and arrays as shape,
dtype and a few values) with what a person asks of such a value in ``%debug`` (`described`): an
array's shape, dtype, device and first values, a list's or a dict's length and first items, an
object's first attributes, all bounded. The sources of the user's files (a cell's, a script's)
go along, for pdb's ``list``. The driver side rebuilds real frames from it
(`hvd_magic.driver.postmortem`) and the locals as stand-ins (`hvd_magic.driver.rank_locals`).

Also which frames are the user's own (`is_users`: not the standard library's, an installed
package's or hvd_magic's), decided here, where the paths are the rank's.
"""

import itertools
import json
import linecache
import os
import reprlib
import sysconfig
import types

from ..errors import unwrap_names


MAX_FRAMES = 40            # the innermost ones
LOCALS_PER_FRAME = 40
SMALL_JSON = 2000          # characters a value may take as itself
SOURCE_MAX = 256 * 1024    # characters of one file's source sent along
SOURCES_MAX = 1024 * 1024
FIRST_VALUES = 32          # of an array, in C order: enough for `x[0]`, `x[:3]` of a small one
ITEMS = 20                 # a list's or dict's first items, an object's first attributes
DESCRIBED_MAX = 512 * 1024  # characters of `described` locals in one capture; then reprs alone

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
    return ["r", unwrap_names(text)]


def _type_name(value):
    """``torch.Tensor``, ``numpy.ndarray``, ``dict``, ``Model`` (one the cell defined)."""
    kind = type(value)
    module = getattr(kind, "__module__", "builtins")
    name = kind.__qualname__ if module in ("builtins", "hvd_magic_cell") else \
        f"{module}.{kind.__qualname__}"
    return unwrap_names(name)


def _is_array(value):
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    return shape is not None and dtype is not None and not callable(shape)


def _first_values(value, shape, n):
    """The first `n` values of an array in C order, as JSON scalars; None if they are not plain
    numbers. Only the rows that hold them are copied (a huge array's own reshape copies it all)."""
    if 0 in shape:
        return []
    rest = 1
    for d in shape[1:]:
        rest *= d
    if len(shape) > 1 and rest >= n:
        return _first_values(value[0], shape[1:], n)
    part = value if not shape else value[:-(-n // max(rest, 1))]
    firsts = part.reshape(-1)[:n].tolist()
    if all(x is None or isinstance(x, (bool, int, float)) for x in firsts):
        return firsts
    return None


def described(value, depth=0):
    """A local as `bounded` sends it, and, for one sent as a repr, what a person asks of it in
    ``%debug``: ["r", text, about]. `about` has the value's "kind" ("array", "dict", "list",
    "tuple", "object") and "type"; an array's "shape", "dtype", "device" and "first" values (a
    CPU one's: a GPU tensor's would wait for its stream); a list's, tuple's or dict's "len" and
    first "items" (a dict's as [key, value] pairs); an object's first "attrs" (its own
    attributes, public ones first). Items and attributes are `described` one level down, with
    fewer of each; below that `bounded`. Never raises."""
    sent = bounded(value)
    if sent[0] != "r":
        return sent
    try:
        return ["r", sent[1], _about(value, depth)]
    except Exception:  # noqa: BLE001  (a user's type may raise anything: its repr is enough)
        return sent


def _about(value, depth):
    about = {"type": _type_name(value)}
    items = ITEMS if depth == 0 else ITEMS // 4

    def inner(v):
        return described(v, depth + 1) if depth < 1 else bounded(v)

    if _is_array(value):
        about.update(kind="array", shape=[int(d) for d in value.shape], dtype=str(value.dtype))
        device = getattr(value, "device", None)
        if device is not None:
            about["device"] = str(device)
        if "cpu" in str(device or "cpu").lower():
            try:
                about["first"] = _first_values(value, about["shape"],
                                               FIRST_VALUES if depth == 0 else 8)
            except Exception:  # noqa: BLE001  (an array type we do not know: shape and dtype)
                pass
    elif isinstance(value, dict):
        about.update(kind="dict", len=len(value), items=[
            [bounded(k), inner(v)] for k, v in itertools.islice(value.items(), items)])
    elif isinstance(value, (list, tuple)):
        about.update(kind="tuple" if isinstance(value, tuple) else "list", len=len(value),
                     items=[inner(v) for v in value[:items]])
    else:
        about["kind"] = "object"
        own = getattr(value, "__dict__", None)
        if isinstance(own, dict) and not isinstance(value, types.ModuleType):  # (`np`: 600)
            names = [n for n in own if isinstance(n, str) and not n.startswith("_")]
            names += [n for n in own if isinstance(n, str) and n.startswith("_")
                      and not n.startswith("__")]
            about["attrs"] = {n: inner(own[n]) for n in names[:items]}
    return about


def bounded_locals(scope, limit=LOCALS_PER_FRAME):
    """A frame's locals, each `bounded`; dunder names left out, at most `limit`."""
    names = [n for n in scope if not (n.startswith("__") and n.endswith("__"))][:limit]
    return {n: bounded(scope[n]) for n in names}


def described_locals(scope, budget):
    """A frame's locals as `bounded_locals`, each `described` while `budget` (a one-item list:
    characters left, shared by the frames of one capture) lasts, then only `bounded`."""
    names = [n for n in scope if not (n.startswith("__") and n.endswith("__"))]
    sent = {}
    for n in names[:LOCALS_PER_FRAME]:
        sent[n] = described(scope[n]) if budget[0] > 0 else bounded(scope[n])
        if len(sent[n]) > 2:
            budget[0] -= len(json.dumps(sent[n]))
    return sent


def capture(tb):
    """{"frames": [[file, line, function, text, user's?, locals], ...] (outermost first),
    "sources": {file: text}} for a traceback."""
    chain = []
    while tb is not None:
        chain.append(tb)
        tb = tb.tb_next
    frames, sources, total, budget = [], {}, 0, [DESCRIBED_MAX]
    for entry in reversed(chain[-MAX_FRAMES:]):  # the innermost first: its locals matter most
        code = entry.tb_frame.f_code
        record = frame_record(code.co_filename, entry.tb_lineno, code.co_name)
        record.append(described_locals(entry.tb_frame.f_locals, budget))
        frames.append(record)
        if record[4] and code.co_filename not in sources:
            text = "".join(linecache.getlines(code.co_filename))[:SOURCE_MAX]
            if text and total + len(text) <= SOURCES_MAX:
                sources[code.co_filename] = text
                total += len(text)
    return {"frames": frames[::-1], "sources": sources}
