"""A rank's share of a ``--data`` DataFrame, read straight from Parquet files.

The driver (`hvd_magic.data.plan`) sends every rank the same *plan*: the files, their row
groups in one fixed order with how many rows each holds after the scan's filter, the columns, the
filter, and each rank's contiguous range of those rows (``starts``/``counts``: the ranks differ by
at most one row, or none with ``--equal-shards``). A rank reads only the row groups its range
touches, with pyarrow: no Spark, no copy through the notebook.

`Share.batches` streams one epoch: the rank's row groups in an order drawn from (seed, epoch),
taken `window` at a time, rows shuffled within each window, cut into batches. Memory stays at
about one window of row groups whatever the share's size. Every rank yields exactly as many
batches (`equal_length`): ``drop_last`` stops at the smallest share's last full batch; otherwise
a share one row short repeats rows of its last window so the last batches match too. Any batch
of any epoch can be the first one (`start_batch`): the windows before it are never read.

Not for: turning batches into numpy or tensors (`hvd_magic.rank.data`).
"""

import math
import os
import urllib.parse

_PLAN = {}

FILTER_OPS = {"==": "__eq__", "!=": "__ne__", "<": "__lt__", "<=": "__le__", ">": "__gt__",
              ">=": "__ge__"}


def use_plan(plan):
    """The plan this process's cell reads (None: the cell has no --data). The same plan again (a
    warm session's next cell over an unchanged DataFrame) keeps what was read of it."""
    def rows(p):  # (what the plan reads, not how the driver came by the files)
        return p and {k: v for k, v in p.items() if k != "source"}

    if plan is not None and rows(plan) == rows(_PLAN.get("plan")):
        return
    _PLAN.clear()
    if plan is not None:
        _PLAN["plan"] = plan


def current_plan():
    return _PLAN.get("plan")


def local_path(uri):
    """A Spark file URI as a path pyarrow opens (``file:/x%20y`` -> ``/x y``); others unchanged."""
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        return urllib.parse.unquote(parsed.path)
    return uri


def open_parquet(uri):
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    path = local_path(uri)
    if "://" in path:
        fs, inner = pafs.FileSystem.from_uri(path)
        return pq.ParquetFile(fs.open_input_file(inner))
    return pq.ParquetFile(path)


def to_expression(spec):
    """A filter, as the driver writes it (nested lists), as a pyarrow compute expression."""
    import pyarrow.compute as pc

    op = spec[0]
    if op == "and":
        return to_expression(spec[1]) & to_expression(spec[2])
    if op == "or":
        return to_expression(spec[1]) | to_expression(spec[2])
    if op == "not":
        return ~to_expression(spec[1])
    if op == "is_null":
        return pc.field(spec[1]).is_null()
    if op == "is_valid":
        return pc.field(spec[1]).is_valid()
    if op == "isin":
        return pc.field(spec[1]).isin(spec[2])
    return getattr(pc.field(spec[1]), FILTER_OPS[op])(spec[2])


def filter_columns(spec):
    if spec is None:
        return []
    if spec[0] in ("and", "or"):
        return filter_columns(spec[1]) + filter_columns(spec[2])
    if spec[0] == "not":
        return filter_columns(spec[1])
    return [spec[1]]


def read_row_group(plan, file_index, row_group, columns=None):
    """One row group of the plan's files, filtered, with the plan's columns (or `columns`)."""
    wanted = plan["columns"] if columns is None else columns
    _check_unchanged(plan, file_index)
    pf = open_parquet(plan["files"][file_index])
    spec = plan.get("filter")
    if spec is None:
        return pf.read_row_group(row_group, columns=wanted)
    extra = [c for c in dict.fromkeys(filter_columns(spec)) if c not in wanted]
    table = pf.read_row_group(row_group, columns=list(wanted) + extra)
    table = table.filter(to_expression(spec))
    return table.select(wanted)


def _check_unchanged(plan, file_index):
    """A file rewritten or deleted since the plan was made would give other rows than planned:
    say so instead (a run of the cell again plans, or converts, afresh)."""
    expected = (plan.get("stats") or [None] * (file_index + 1))[file_index]
    path = local_path(plan["files"][file_index])
    if expected is None or "://" in path:
        return
    try:
        st = os.stat(path)
        now = [st.st_size, st.st_mtime_ns]
    except OSError:
        now = None
    if now != expected:
        raise RuntimeError(
            f"--data: {path} was {'deleted' if now is None else 'rewritten'} after this cell's "
            "shards were planned, so this rank cannot read the rows it was given. Run the cell "
            "again (a DataFrame converted into the data cache is then converted again).")


class Share:
    """This rank's rows of a plan: ``pieces`` are (file, row group, first row, end row)."""

    def __init__(self, plan, rank):
        self.plan = plan
        self.rank = rank
        self.rows = plan["counts"][rank]
        self.cached = None  # the whole share, once `hvd_magic.shard()` read it
        start = plan["starts"][rank]
        end = start + self.rows
        self.pieces = []
        at = 0
        for file_index, row_group, n in plan["pieces"]:
            lo, hi = max(start, at), min(end, at + n)
            if lo < hi:
                self.pieces.append((file_index, row_group, lo - at, hi - at))
            at += n

    def read(self, piece, columns=None):
        file_index, row_group, lo, hi = piece
        table = read_row_group(self.plan, file_index, row_group, columns)
        return table.slice(lo, hi - lo)

    def table(self):
        """The whole share in memory (for data that fits)."""
        import pyarrow as pa

        tables = [self.read(p) for p in self.pieces]
        return pa.concat_tables(tables) if tables else None

    def equal_length(self, batch_size, drop_last):
        """(batches every rank yields, rows they hold in all)."""
        counts = self.plan["counts"]
        if drop_last:
            n = min(counts) // batch_size
            return n, n * batch_size
        return math.ceil(max(counts) / batch_size), max(counts)

    def windows(self, epoch, seed, shuffle, window):
        """The epoch's windows: lists of pieces, in the epoch's order."""
        import numpy as np

        order = (np.random.default_rng([seed, epoch]).permutation(len(self.pieces)) if shuffle
                 else np.arange(len(self.pieces)))
        pieces = [self.pieces[i] for i in order]
        return [pieces[i:i + window] for i in range(0, len(pieces), window)]

    def _window(self, pieces, epoch, seed, shuffle, index, columns, form):
        """A window's rows, as `form` prepared them in the window's order (drawn from seed,
        epoch, window): position k of the window is its k-th row in that order."""
        import numpy as np
        import pyarrow as pa

        table = pa.concat_tables([self.read(p, columns) for p in pieces])
        order = (np.random.default_rng([seed, epoch, index]).permutation(table.num_rows)
                 if shuffle else None)
        return form.prepare(table, order)

    def batches(self, batch_size, epoch=0, seed=0, shuffle=True, drop_last=False, window=2,
                start_batch=0, columns=None, form=None):
        """One epoch's batches, from batch `start_batch` on; only `columns` are read (default: the
        plan's). A batch is a ``pyarrow.Table``, or what `form` makes of a window's rows (see
        `ArrowRows`; `hvd_magic.rank.data` makes numpy arrays)."""
        form = form or ArrowRows
        check_batch_args(batch_size, window, start_batch)
        _, total = self.equal_length(batch_size, drop_last)
        position = min(start_batch * batch_size, total)
        pending, pending_rows = [], 0

        def cut(rows, segments):
            # Batches are taken from the window's positions lo..hi of each segment (copies: the
            # window is freed once its last batch is out); the rest waits for the next window.
            nonlocal pending, pending_rows
            for lo, hi in segments:
                while lo < hi:
                    take = min(batch_size - pending_rows, hi - lo)
                    pending.append(form.take(rows, lo, lo + take))
                    pending_rows += take
                    lo += take
                    if pending_rows == batch_size:
                        batch = form.join(pending)
                        pending, pending_rows = [], 0
                        yield batch

        at = 0
        windows = self.windows(epoch, seed, shuffle, window)
        for index, pieces in enumerate(windows):
            size = sum(hi - lo for _, _, lo, hi in pieces)
            if at + size > position and at < total:
                rows = self._window(pieces, epoch, seed, shuffle, index, columns, form)
                hi = min(size, total - at)
                yield from cut(rows, [(position - at, hi)])
                del rows  # (before the next window is read; its memory goes back to the OS, so
                _release_unused()  # a rank's RSS stays flat)
                position = at + hi
            at += size
        if total > self.rows and position < total:  # one row short: repeat rows of the last window
            size = sum(hi - lo for _, _, lo, hi in windows[-1])
            rows = self._window(windows[-1], epoch, seed, shuffle, len(windows) - 1, columns, form)
            skip = position - self.rows
            yield from cut(rows, [((skip + i) % size, (skip + i) % size + 1)
                                  for i in range(total - position)])
        if pending_rows:
            yield form.join(pending)


def _release_unused():
    import pyarrow as pa
    pa.default_memory_pool().release_unused()


class ArrowRows:
    """What `Share.batches` makes of a window's rows by default: ``pyarrow.Table`` batches.

    A form says how a window is prepared once, given the order of its rows (`prepare`; None:
    as read), how the rows at positions lo..hi of that order are taken from it (`take`: a copy,
    so the window can be freed while a batch that spans two windows waits for the rest of its
    rows) and how the pieces of a batch become one (`join`)."""

    @staticmethod
    def prepare(table, order):
        # One chunk per column: a batch's rows are then gathered straight from it (taking from a
        # column of several chunks joins them first, for every batch)
        return table.combine_chunks(), order

    @staticmethod
    def take(window, lo, hi):
        table, order = window
        return (table.slice(lo, hi - lo).combine_chunks() if order is None
                else table.take(arrow_indices(order[lo:hi])))

    @staticmethod
    def join(pieces):
        import pyarrow as pa
        return pieces[0] if len(pieces) == 1 else pa.concat_tables(pieces).combine_chunks()


def arrow_indices(indices):
    """Row indices (numpy int64) as an Arrow array, sharing their memory. (``Table.take`` given
    numpy indices converts them with ``pa.array``, whose first call imports pandas to check what
    it was given: 0.3-0.5 s here, before a rank's first batch.)"""
    import numpy as np
    import pyarrow as pa

    indices = np.ascontiguousarray(indices, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(indices), [None, pa.py_buffer(indices)])


def check_batch_args(batch_size, window, start_batch):
    for name, value, least in (("batch_size", batch_size, 1), ("window", window, 1),
                               ("start_batch", start_batch, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name} must be a whole number ≥ {least}, not {value!r}")


def my_share():
    """This rank's `Share` of the current plan, or None without one."""
    plan = current_plan()
    if plan is None:
        return None
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    cached = _PLAN.get("share")
    if cached is None or cached.rank != rank:
        cached = _PLAN["share"] = Share(plan, rank)
    return cached
