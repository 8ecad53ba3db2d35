"""A rank's share of the ``--data`` DataFrame: `shard()`, and batches of it for PyTorch and
TensorFlow.

The task writes this rank's rows to a local Arrow IPC file while the rank starts
(`hvd_magic.task.shard`); `shard()` waits until they are all there, then memory-maps the file, so the table costs no copy, a second call is
free, and pages the rank does not touch are never read. Batches are gathered from it one at a
time (`Table.take`), so a rank holds its shard once plus one batch.

`columns` says what a batch holds, in order: a column name gives one array (a column of
fixed-length arrays or ML vectors gives a 2-D one), a list of names gives their values side by side
as one 2-D array. ``columns=(["x1", "x2"], "label")`` gives ``(features, labels)`` batches, as
Keras' ``fit`` and most PyTorch loops want them.
"""

import os

_SHARD = {}


def shard():
    """This rank's rows of the ``--data`` DataFrame, as a ``pyarrow.Table`` backed by a
    memory-mapped local Arrow file. Shards are disjoint, and all of them together are the
    DataFrame; with ``--equal-shards`` every rank has the same number of rows.

    Examples
    --------
    >>> table = hvd_magic.shard()
    >>> table.num_rows, table.column_names
    (2500, ['x1', 'x2', 'label'])
    >>> table.to_pandas()         # a copy, when pandas is handier
    """
    path = os.environ.get("HVD_MAGIC_SHARD")
    if not path:
        raise RuntimeError(
            "hvd_magic.shard() has nothing to return: this run was started without a DataFrame. "
            "Start it with `%%horovod --np N --data df` (or hvd_magic.run(fn, np=N, data=df)).")
    if path not in _SHARD:
        import pyarrow as pa

        rows = _wait_for_rows(os.environ.get("HVD_MAGIC_SHARD_READY"))
        table = pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
        _SHARD[path] = table.slice(0, rows) if rows is not None and rows < table.num_rows else table
    return _SHARD[path]


def _wait_for_rows(ready):
    """The rows this rank may read, once its task wrote them all and every task agreed on the
    shards' sizes (the rank starts while Spark still sends them). If the run stops meanwhile,
    the task ends this process."""
    if not ready:
        return None
    import time

    while not os.path.exists(ready):
        time.sleep(0.005)
    with open(ready) as f:
        return int(f.read())


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
        flat = column.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(column), -1) if len(column) else flat.reshape(0, 0)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        return np.array(column.to_pylist(), dtype=object)
    if column.null_count:
        raise ValueError(f"column {name!r} has nulls in this batch; fill or drop them in Spark "
                         "first (e.g. df.na.drop())")
    return column.to_numpy(zero_copy_only=False)


def _spec(table, columns):
    names = table.column_names
    spec = list(names) if columns is None else [columns] if isinstance(columns, str) else list(columns)
    for item in spec:
        for name in [item] if isinstance(item, str) else item:
            if name not in names:
                raise KeyError(f"no column {name!r} in the shard; it has {names}")
    return spec, isinstance(columns, str)


def numpy_batches(batch_size, columns=None, epoch=0, seed=0, shuffle=True, drop_last=False,
                  table=None):
    """Batches of the shard (or `table`) as numpy arrays; see the module's doc for `columns`."""
    import numpy as np

    table = shard() if table is None else table
    spec, single = _spec(table, columns)
    for indices in batch_indices(table.num_rows, batch_size, epoch, seed, shuffle, drop_last):
        rows = table.take(indices)
        arrays = []
        for item in spec:
            if isinstance(item, str):
                arrays.append(_as_numpy(rows.column(item), item))
            else:
                parts = [_as_numpy(rows.column(n), n) for n in item]
                arrays.append(np.column_stack(parts))
        yield arrays[0] if single else tuple(arrays)


def torch_batches(batch_size, columns=None, epoch=0, seed=0, shuffle=True, drop_last=False,
                  table=None):
    """Batches of the shard as torch tensors (string columns stay numpy arrays of str).

    >>> for epoch in range(3):
    ...     for x, y in hvd_magic.torch_batches(64, (["x1", "x2"], "label"), epoch=epoch):
    ...         loss = loss_fn(model(x), y)
    """
    import numpy as np
    import torch

    def tensor(a):
        # (a batch is read-only Arrow memory: torch wants its own writable copy)
        return torch.from_numpy(np.require(a, requirements=["C", "W"])) if a.dtype != object else a

    for batch in numpy_batches(batch_size, columns, epoch, seed, shuffle, drop_last, table):
        yield tuple(tensor(a) for a in batch) if isinstance(batch, tuple) else tensor(batch)


def tf_dataset(batch_size, columns=None, epochs=1, seed=0, shuffle=True, drop_last=False,
               table=None):
    """The shard as a ``tf.data.Dataset`` of batches, `epochs` epochs in a row, each in a new
    order (seeded): ``model.fit(hvd_magic.tf_dataset(64, (["x1", "x2"], "label")))``."""
    import tensorflow as tf

    table = shard() if table is None else table
    first = next(numpy_batches(1, columns, shuffle=False, table=table.slice(0, 1)))
    single = not isinstance(first, tuple)

    def signature(a):
        return tf.TensorSpec((None,) + a.shape[1:], tf.string if a.dtype == object else a.dtype)

    spec = signature(first) if single else tuple(signature(a) for a in first)

    def generate():
        for epoch in range(epochs):
            yield from numpy_batches(batch_size, columns, epoch, seed, shuffle, drop_last, table)

    return tf.data.Dataset.from_generator(generate, output_signature=spec)
