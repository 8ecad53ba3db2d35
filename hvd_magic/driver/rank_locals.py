"""A failed rank's locals, in the notebook's ``%debug``, as stand-ins for the rank's values.

The rank sent each local as itself (a small JSON value) or as its repr with what a person asks
of it (`hvd_magic.rank.frames.described`): an array's shape, dtype, device and first values, a
list's or a dict's length and first items, an object's first attributes. `standin` makes of
that something pdb's ``p`` can ask the way one asks the real value: ``x.shape``, ``x.dtype``,
``len(x)``, ``x[0]``, ``d["w"].shape``, ``list(d)``, ``self.lr``. Where the answer was not sent
(an attribute, an item past the first ones, a method's result) the error says so, and what came
back: ``x.mean was not sent from rank 1 (x is a torch.Tensor there: only its shape, dtype,
device and first 32 values came back)``. A stand-in's class is named as the rank's type
(``Tensor``), so that Python's own messages (``unsupported operand type(s) for +: 'Tensor'``)
read as they would there. Nothing is unpickled; nothing here runs the rank's code.

Not for: the frames themselves (`hvd_magic.driver.postmortem`).
"""

import itertools
import math


def standin(sent, name, rank=None):
    """A local as the rank sent it: ["v", x] is x, ["t", [...]] a tuple, ["r", text] (and, from
    `described`, what a person may ask of it) a stand-in whose repr is the rank's text. `name`
    is how a person reaches it (``x``, ``d['w']``, ``self.lr``): the messages say it."""
    kind, data = sent[0], sent[1]
    if kind == "v":
        return data
    if kind == "t":
        return tuple(data)
    about = sent[2] if len(sent) > 2 and isinstance(sent[2], dict) else {}
    return _KINDS.get(about.get("kind"), _Sent).make(_Info(str(data), about, name, rank))


class _Info:
    """What one stand-in knows: the rank's text, `about`, its name, which rank."""

    def __init__(self, text, about, name, rank):
        self.text, self.about, self.name, self.rank = text, about, name, rank
        self.type = str(about.get("type") or "value")
        self.where = f"rank {rank}" if rank is not None else "the rank"


class _SentType(type):
    """A stand-in's class reads as the rank's type, and says it is a stand-in for one."""

    def __repr__(cls):
        return f"<class '{cls._rank_type}' (as the rank sent it)>"


_classes = {}


def _named(base, type_name):
    """`base` under the rank's type name (``Tensor``), made once per pair."""
    if (base, type_name) not in _classes:
        module, _, short = type_name.rpartition(".")
        _classes[base, type_name] = _SentType(short, (base,), {
            "__module__": module or "builtins", "__qualname__": short, "_rank_type": type_name})
    return _classes[base, type_name]


def _an(type_name):
    return ("an " if type_name[:1].lower() in "aeiou" else "a ") + type_name


class _Sent(metaclass=_SentType):
    """A local the rank sent as its repr alone (or a kind not known here)."""

    _rank_type = "value"

    @classmethod
    def make(cls, info):
        made = object.__new__(_named(cls, info.type))
        made._info = info
        return made

    def __repr__(self):  # (and `str`: no type here defines its own)
        return self._info.text

    def _came(self):
        return "its repr"

    def _not_sent(self, part):
        """``x.foo was not sent from rank 1 (x is a torch.Tensor there: only ... came back)``."""
        info = self._info
        return (f"{info.name}{part} was not sent from {info.where} ({info.name} is "
                f"{_an(info.type)} there: only {self._came()} came back)")

    def _not_computed(self, op):
        info = self._info
        return TypeError(f"{info.name} {op} ... is not computed in %debug: {info.name} is "
                         f"{_an(info.type)} on {info.where}, and only {self._came()} came back")

    def __getattr__(self, attr):
        if attr.startswith("__") or attr == "_info":  # Python's own protocols; not set yet
            raise AttributeError(attr)
        if self._info.type in ("dict", "list", "tuple"):  # what Python says of the real value
            raise AttributeError(f"'{self._info.type}' object has no attribute '{attr}'")
        raise AttributeError(self._not_sent(f".{attr}"))


def _operator(symbol):
    def not_computed(self, *other):
        raise self._not_computed(symbol)
    return not_computed


# `x + 1`, `x > 0`, `w @ x` on the rank's value: not Python's "unsupported operand" (the rank's
# type supports them), but what came back
for _name, _symbol in (("add", "+"), ("sub", "-"), ("mul", "*"), ("truediv", "/"),
                       ("floordiv", "//"), ("mod", "%"), ("pow", "**"), ("matmul", "@")):
    setattr(_Sent, f"__{_name}__", _operator(_symbol))
    setattr(_Sent, f"__r{_name}__", _operator(_symbol))
for _name, _symbol in (("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="), ("neg", "-"),
                       ("abs", "abs"), ("float", "float"), ("int", "int")):
    setattr(_Sent, f"__{_name}__", _operator(_symbol))


class _Object(_Sent):
    """An object: its own first attributes came along."""

    def _came(self):
        attrs = list(self._info.about.get("attrs") or ())
        return "its repr" + (f" and its attributes {', '.join(attrs)}" if attrs else "")

    def __getattr__(self, attr):
        attrs = {} if attr == "_info" else self._info.about.get("attrs") or {}
        if attr in attrs:
            return standin(attrs[attr], f"{self._info.name}.{attr}", self._info.rank)
        return super().__getattr__(attr)


class _Size(tuple):
    """An array's shape, shown as the rank's framework shows it: ``torch.Size([3, 4])``."""

    torch = False

    def __repr__(self):
        return f"torch.Size({list(self)})" if self.torch else tuple.__repr__(self)


class _Text(str):
    """A name that reads as itself in ``p``: ``torch.float32``, not ``'torch.float32'``."""

    def __repr__(self):
        return str(self)


def _product(dims):
    return math.prod(int(d) for d in dims)


def _nest(flat, shape):
    """C-order values as nested lists of `shape`."""
    if len(shape) <= 1:
        return list(flat)
    step = _product(shape[1:])
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _key_text(keys):
    def one(k):
        if not isinstance(k, slice):
            return repr(k)
        text = ":".join("" if v is None else str(v) for v in (k.start, k.stop, k.step))
        return text.removesuffix(":") if k.step is None else text
    return ", ".join(one(k) for k in keys)


class _Array(_Sent):
    """A tensor or an array: its shape, dtype, device and first values (C order) came along."""

    def _firsts(self):
        return self._info.about.get("first") or []

    def _complete(self):
        return "first" in self._info.about and len(self._firsts()) >= self.__len_all()

    def __len_all(self):
        return _product(self._info.about["shape"])

    def _came(self):
        about, firsts = self._info.about, self._firsts()
        parts = ["its shape", "dtype"] + (["device"] if "device" in about else [])
        if self._complete():
            return f"{', '.join(parts)} and all {len(firsts)} of its values"
        if firsts:
            return f"{', '.join(parts)} and first {len(firsts)} values"
        return f"{', '.join(parts[:-1])} and {parts[-1]}"

    def _answers(self):
        """What the rank's type answers from what came: shape, dtype... (numpy's `size` is a
        number, torch's a method)."""
        about = self._info.about
        shape = _Size(int(d) for d in about["shape"])
        shape.torch = self._info.type.startswith("torch.")
        answers = {"shape": shape, "dtype": _Text(about["dtype"]), "ndim": len(shape)}
        if "device" in about:
            answers["device"] = _Text(about["device"])
        if self._info.type.startswith("torch."):
            answers.update(size=lambda dim=None: shape if dim is None else shape[dim],
                           dim=lambda: len(shape), numel=self.__len_all,
                           is_cuda="cuda" in about.get("device", ""))
        else:
            answers["size"] = self.__len_all()
        return answers

    def __getattr__(self, attr):
        if attr != "_info" and not attr.startswith("__"):
            answers = self._answers()
            if attr in answers:
                return answers[attr]
        return super().__getattr__(attr)

    def __len__(self):
        shape = self._info.about["shape"]
        if not shape:
            raise TypeError(f"len() of a 0-d {self._info.type}")
        return int(shape[0])

    def __iter__(self):
        if not self._complete():
            raise IndexError(self._not_sent(" as a whole"))
        return iter([self[i] for i in range(len(self))])

    def tolist(self):
        if not self._complete():
            raise IndexError(self._not_sent(".tolist()"))
        shape = self._info.about["shape"]
        firsts = self._firsts()
        return firsts[0] if not shape else _nest(firsts[:self.__len_all()], shape)

    def item(self):
        if self.__len_all() != 1:
            raise ValueError(f"only one element {self._info.type}s can be converted to Python "
                             f"scalars ({self._info.name} has {self.__len_all()})")
        if not self._firsts():
            raise IndexError(self._not_sent(".item()"))
        return self._firsts()[0]

    def __getitem__(self, key):
        """An integer or a slice per axis: a value, or a part (a stand-in of its own) when
        every value it holds is among the first ones that came."""
        shape = [int(d) for d in self._info.about["shape"]]
        keys = key if isinstance(key, tuple) else (key,)
        text = f"[{_key_text(keys)}]"
        if len(keys) > len(shape):
            raise IndexError(f"too many indices for {self._info.name}: it has {len(shape)} "
                             f"dimension{'s' if len(shape) != 1 else ''}")
        axes = []  # (the indices asked on that axis, whether the axis stays)
        for axis, (k, n) in enumerate(zip(keys, shape)):
            if isinstance(k, slice):
                axes.append((range(*k.indices(n)), True))
            elif isinstance(k, int) and not isinstance(k, bool):
                if not -n <= k < n:
                    raise IndexError(f"index {k} is out of bounds for dimension {axis} with "
                                     f"size {n}")
                axes.append((range(k % n, k % n + 1), False))
            else:
                raise IndexError(self._not_sent(text) + "; integers and slices can be asked")
        axes += [(range(n), True) for n in shape[len(keys):]]
        kept = [len(r) for r, stays in axes if stays]
        strides = [_product(shape[i + 1:]) for i in range(len(shape))]
        firsts = self._firsts()
        values = []
        if _product(kept):
            last = sum(max(r[0], r[-1]) * s for (r, _), s in zip(axes, strides))
            if last >= len(firsts):
                raise IndexError(self._not_sent(text))
            values = [firsts[sum(i * s for i, s in zip(at, strides))]
                      for at in itertools.product(*(r for r, _ in axes))]
        if not kept:
            return values[0]
        return self._part(self._info.name + text, kept, values)

    def _part(self, name, shape, values):
        about = {k: v for k, v in self._info.about.items() if k not in ("shape", "first")}
        about.update(shape=shape, first=values)
        short = self._info.type.rpartition(".")[2]
        shown = ", ".join(repr(v) for v in values)  # (a part holds only values that came)
        text = f"{short}(shape={tuple(shape)}, dtype={about['dtype']}, [{shown}])"
        return _Array.make(_Info(text, about, name, self._info.rank))


class _Items:
    """What a sent list, tuple or dict shares: its length on the rank and its first items."""

    def _count(self):
        return int(self._info.about.get("len", 0))

    def _sent_count(self):
        return len(self._info.about.get("items") or ())

    def _complete(self):
        return self._sent_count() >= self._count()

    def _came(self):
        if self._complete():
            return f"its {self._count()} items"
        return f"its length ({self._count()}) and its first {self._sent_count()} items"

    def __len__(self):
        return self._count()

    def _whole(self):
        if not self._complete():
            info, sent = self._info, self._sent_count()
            raise IndexError(f"{info.name} has {self._count()} items on {info.where}, and only "
                             f"its first {sent} came back: {info.name}[:{sent}]"
                             if not isinstance(self, dict) else
                             f"{info.name} has {self._count()} keys on {info.where}, and only "
                             f"these {sent} came back: {list(dict.keys(self))}")


class _Sequence(_Items):
    """A list or a tuple: ``len(batch)``, ``batch[0]``, ``batch[:3]``, ``batch[0].shape``."""

    @classmethod
    def make(cls, info):
        items = [standin(v, f"{info.name}[{i}]", info.rank)
                 for i, v in enumerate(info.about.get("items") or ())]
        made = _named(cls, info.type)(items)
        made._info = info
        return made

    def __getitem__(self, key):
        count, sent = self._count(), self._sent_count()
        if isinstance(key, slice):
            asked = range(*key.indices(count))
            if asked and max(asked[0], asked[-1]) >= sent:
                raise IndexError(self._not_sent(f"[{_key_text((key,))}]"))
            whole = self._base.__getitem__(self, slice(0, sent))
            return type(whole)(whole[i] for i in asked)
        if isinstance(key, int) and not isinstance(key, bool):
            if not -count <= key < count:
                raise IndexError(f"{self._info.type} index out of range")
            if key % count >= sent:
                raise IndexError(self._not_sent(f"[{key}]"))
            return self._base.__getitem__(self, key % count)
        return self._base.__getitem__(self, key)  # Python's own error for other keys

    def __iter__(self):
        return self._whole() or self._base.__iter__(self)


class _List(_Sequence, _Sent, list):
    """A list the rank sent as its repr."""

    _base = list


class _Tuple(_Sequence, _Sent, tuple):
    """A tuple the rank sent as its repr."""

    _base = tuple


class _Dict(_Items, _Sent, dict):
    """A dict: ``len(d)``, ``list(d)``, ``d["w"].shape``, for the keys that came."""

    @classmethod
    def make(cls, info):
        made = _named(cls, info.type)()
        made._info = info
        for key, value in info.about.get("items") or ():
            key = standin(key, "key", info.rank)
            try:
                dict.__setitem__(made, key, standin(value, f"{info.name}[{key!r}]",
                                                    info.rank))
            except TypeError:  # a key that came as text cannot be hashed: asked by no one
                continue
        return made

    def __missing__(self, key):
        raise KeyError(key if self._complete() else self._not_sent(f"[{key!r}]"))

    def get(self, key, default=None):
        return self[key] if key in self else default

    def __contains__(self, key):
        if dict.__contains__(self, key) or self._complete():
            return dict.__contains__(self, key)
        raise KeyError(self._not_sent(f"[{key!r}]"))

    def __iter__(self):  # (`_whole` says why where not every key came)
        return self._whole() or dict.__iter__(self)

    def keys(self):
        return self._whole() or dict.keys(self)

    def values(self):
        return self._whole() or dict.values(self)

    def items(self):
        return self._whole() or dict.items(self)


_KINDS = {"array": _Array, "dict": _Dict, "list": _List, "tuple": _Tuple, "object": _Object}
