"""A rank's share of the ``--data`` DataFrame: `shard()`, and batches of it for numpy, PyTorch
and TensorFlow.

The rows come straight from Parquet files (the DataFrame's own when it is a plain Parquet scan,
else the copy Spark wrote once into the data cache): `hvd_magic.rank.stream` reads them.
`shard()` reads the rank's whole share into memory (for data that fits); the batch functions
stream it a window of row groups at a time, give every rank the same number of batches, and can
start at any (epoch, batch).

`columns` says what a batch holds, in order: a column name gives one array (a column of
fixed-length arrays or ML vectors gives a 2-D one), a list of names gives their values side by side
as one 2-D array. ``columns=(["x1", "x2"], "label")`` gives ``(features, labels)`` batches, as
Keras' ``fit`` and most PyTorch loops want them.
"""

from . import stream

def shard():
    """This rank's rows of the ``--data`` DataFrame, as a ``pyarrow.Table`` in memory. Shards are
    disjoint, all of them together are the DataFrame, and they differ by at most one row (none
    with ``--equal-shards``). For data larger than memory, use the batch functions instead.

    Examples
    --------
    >>> table = hvd_magic.shard()
    >>> table.num_rows, table.column_names
    (2500, ['x1', 'x2', 'label'])
    >>> table.to_pandas()         # a copy, when pandas is handier
    """
    share = _share()
    if share.cached is None:
        share.cached = share.table()
    return share.cached


def _share():
    share = stream.my_share()
    if share is None:
        raise RuntimeError(
            "hvd_magic.shard() has nothing to return: this run was started without a DataFrame. "
            "Start it with `%%horovod --np N --data df` (or hvd_magic.run(fn, np=N, data=df)).")
    return share


def batch_indices(rows, batch_size, epoch=0, seed=0, shuffle=True, drop_last=False):
    """Row indices of each batch of one epoch: a new order every epoch, the same for a given
    (seed, epoch) on every run."""
    import numpy as np

    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive whole number, not {batch_size!r}")
    order = (np.random.default_rng([seed, epoch]).permutation(rows) if shuffle
             else np.arange(rows))
    end = rows - rows % batch_size if drop_last else rows
    return [order[i:i + batch_size] for i in range(0, end, batch_size)]


def _as_numpy(column, name):
    """One column of a batch as a numpy array (2-D for fixed-length arrays)."""
    import numpy as np
    import pyarrow as pa

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        lengths = set(column.value_lengths().to_pylist()) if not pa.types.is_fixed_size_list(kind) else None
        if column.null_count or (lengths is not None and len(lengths) > 1):
            raise ValueError(f"column {name!r} holds arrays of different lengths (or nulls), which "
                             "do not stack into one tensor; pad them in Spark first")
        flat = _to_numpy(column.flatten())
        return flat.reshape(len(column), -1) if len(column) else flat.reshape(0, 0)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        return np.array(column.to_pylist(), dtype=object)
    if column.null_count:
        raise ValueError(f"column {name!r} has nulls in this batch; fill or drop them in Spark "
                         "first (e.g. df.na.drop())")
    return _to_numpy(column)


def _to_numpy(array):
    """An Arrow array as numpy: integers and floats without nulls as a view of its buffer
    (Arrow's own conversion imports pandas on its first call, 0.3-0.5 s before a rank's first
    batch), other types converted by Arrow."""
    import numpy as np
    import pyarrow as pa

    kind = array.type
    if (array.null_count or not len(array)
            or not (pa.types.is_integer(kind) or pa.types.is_floating(kind))):
        return array.to_numpy(zero_copy_only=False)
    dtype = np.dtype(kind.to_pandas_dtype())
    return np.frombuffer(array.buffers()[1], dtype=dtype, count=len(array),
                         offset=array.offset * dtype.itemsize)


def _spec(names, columns):
    spec = list(names) if columns is None else [columns] if isinstance(columns, str) else list(columns)
    for item in spec:
        for name in [item] if isinstance(item, str) else item:
            if name not in names:
                raise KeyError(f"no column {name!r} in the shard; it has {names}")
    return spec, isinstance(columns, str)


class NumpyRows:
    """Batches as numpy arrays (`hvd_magic.rank.stream.ArrowRows` says what a form is). Each
    array of `spec` is made once per window, its rows put in the window's order by one gather
    (``np.take``); a batch is then a copy of consecutive rows. Gathering each batch's rows from
    the window instead, column by column, was most of a streamed epoch's time: as many random
    reads, made in small calls that each miss the cache anew."""

    def __init__(self, spec, single):
        self.spec, self.single = spec, single

    def arrays(self, table):
        import numpy as np

        return [_as_numpy(table.column(item), item) if isinstance(item, str) else
                np.column_stack([_as_numpy(table.column(n), n) for n in item])
                for item in self.spec]

    def prepare(self, table, order):
        import numpy as np

        arrays = self.arrays(table)
        return arrays if order is None else [np.take(a, order, axis=0) for a in arrays]

    @staticmethod
    def take(arrays, lo, hi):
        return [a[lo:hi].copy() for a in arrays]

    def join(self, pieces):
        import numpy as np

        arrays = pieces[0] if len(pieces) == 1 else [np.concatenate(p) for p in zip(*pieces)]
        return arrays[0] if self.single else tuple(arrays)


def numpy_batches(batch_size, columns=None, epoch=0, seed=0, shuffle=True, drop_last=False,
                  table=None, start_batch=0, window=2):
    """One epoch of batches of the rank's share (or of `table`) as numpy arrays; see the module's
    doc for `columns`.

    The share is streamed from its Parquet files `window` row groups at a time, in an order drawn
    from (`seed`, `epoch`), rows shuffled within each window. Every rank yields the same number of
    batches: ``drop_last=True`` stops at the smallest share's last full batch, otherwise a share
    one row short repeats a row so that every rank's last batch has the same size.
    `start_batch` resumes an epoch there (e.g. after an elastic restart) without reading what
    comes before it."""
    if table is not None:
        import numpy as np

        form = NumpyRows(*_spec(table.column_names, columns))
        arrays = form.arrays(table)
        for i, indices in enumerate(batch_indices(table.num_rows, batch_size, epoch, seed,
                                                  shuffle, drop_last)):
            if i >= start_batch:
                yield form.join([[np.take(a, indices, axis=0) for a in arrays]])
        return
    share = _share()
    names = share.plan["columns"]
    spec, single = _spec(names, columns)
    wanted = [n for n in names if any(n == item or (not isinstance(item, str) and n in item)
                                      for item in spec)]  # only these are read from the files
    yield from share.batches(batch_size, epoch, seed, shuffle, drop_last, window, start_batch,
                             wanted, form=NumpyRows(spec, single))


def batch_count(batch_size, drop_last=False):
    """How many batches each rank's `numpy_batches` (or torch's, tf's) yields per epoch: the same
    on every rank."""
    stream.check_batch_args(batch_size, 1, 0)
    return _share().equal_length(batch_size, drop_last)[0]


def torch_batches(batch_size, columns=None, epoch=0, seed=0, shuffle=True, drop_last=False,
                  table=None, start_batch=0, window=2):
    """`numpy_batches` as torch tensors (string columns stay numpy arrays of str).

    >>> for epoch in range(3):
    ...     for x, y in hvd_magic.torch_batches(64, (["x1", "x2"], "label"), epoch=epoch):
    ...         loss = loss_fn(model(x), y)
    """
    import numpy as np
    import torch

    def tensor(a):
        # (a batch is read-only Arrow memory: torch wants its own writable copy)
        return torch.from_numpy(np.require(a, requirements=["C", "W"])) if a.dtype != object else a

    for batch in numpy_batches(batch_size, columns, epoch, seed, shuffle, drop_last, table,
                               start_batch, window):
        yield tuple(tensor(a) for a in batch) if isinstance(batch, tuple) else tensor(batch)


def tf_dataset(batch_size, columns=None, epochs=1, seed=0, shuffle=True, drop_last=False,
               table=None, start=(0, 0), window=2):
    """The share as a ``tf.data.Dataset`` of batches, `epochs` epochs in a row, each in a new
    order (seeded), from the (epoch, batch) position `start`:
    ``model.fit(hvd_magic.tf_dataset(64, (["x1", "x2"], "label")))``."""
    import tensorflow as tf

    first = next(numpy_batches(1, columns, shuffle=False, table=table, window=1))
    single = not isinstance(first, tuple)

    def signature(a):
        return tf.TensorSpec((None,) + a.shape[1:], tf.string if a.dtype == object else a.dtype)

    spec = signature(first) if single else tuple(signature(a) for a in first)

    def generate():
        for epoch in range(start[0], epochs):
            yield from numpy_batches(batch_size, columns, epoch, seed, shuffle, drop_last, table,
                                     start[1] if epoch == start[0] else 0, window)

    return tf.data.Dataset.from_generator(generate, output_signature=spec)
