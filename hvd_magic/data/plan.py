"""The plan every rank reads its ``--data`` rows by (`hvd_magic.rank.stream`), made on the
driver from Parquet files' footers: no Spark job, no row read (except a filter's columns, to
count the rows it keeps).

The rows are numbered in one fixed order (file by file, row group by row group); rank r gets
the contiguous range from ``r * total // np``: shares differ by at most one row, and a rank may
start or end inside a row group (several ranks can share one). ``--equal-shards`` gives every
rank the smallest share's count. Everything wrong with the files is said here, before a rank
starts: an unreadable file, one that changed since Spark listed it, columns that differ between
files, fewer rows than ranks.
"""

import concurrent.futures
import os

from IPython.core.error import UsageError

from ..words import plural
from ..rank import stream


def _footer(uri, spec, columns):
    """(the file's Arrow schema of `columns`, rows per row group after the filter `spec`)."""
    pf = stream.open_parquet(uri)
    meta = pf.metadata
    schema = pf.schema_arrow
    if spec is None:
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    else:
        plan = {"files": [uri], "columns": stream.filter_columns(spec)[:1], "filter": spec}
        counts = [stream.read_row_group(plan, 0, i).num_rows for i in range(meta.num_row_groups)]
    missing = [c for c in columns if schema.get_field_index(c) < 0]
    if missing:
        raise KeyError(", ".join(missing))
    return schema if not columns else [schema.field(c) for c in columns], counts


def build_plan(files, columns, spec, np, source):
    """The plan for `np` ranks over Parquet `files` (URIs as Spark lists them), reading
    `columns` (None: all) of the rows that pass `spec` (`hvd_magic.rank.stream.to_expression`)."""
    if not files:
        raise UsageError("--data: the DataFrame has no files to read; there is nothing to train on.")
    files = sorted(files)  # (Spark lists them in no set order: the shards must not change)
    wanted = list(columns or [])
    with concurrent.futures.ThreadPoolExecutor(min(16, len(files))) as pool:
        futures = [pool.submit(_footer, uri, spec, wanted) for uri in files]
        footers = []
        for uri, future in zip(files, futures):
            try:
                footers.append(future.result())
            except KeyError as exc:
                raise UsageError(f"--data: {stream.local_path(uri)} has no column {exc}; the "
                                 "files of this DataFrame differ. Rewrite them with one schema, "
                                 "or select the columns they share.") from None
            except Exception as exc:
                raise UsageError(
                    f"--data: this notebook cannot read {stream.local_path(uri)} ({type(exc).__name__}: "
                    f"{exc}). The ranks read the DataFrame's Parquet files themselves: check that "
                    "the file exists and is Parquet, and that this machine sees the same files as "
                    "the executors.") from None
    schemas = {repr(s) for s, _ in footers}
    if len(schemas) > 1:
        raise UsageError("--data: the DataFrame's Parquet files do not share one schema for the "
                         f"columns read ({len(schemas)} variants). Rewrite them with one schema "
                         "(spark.read...write.parquet).")
    pieces = [[f, g, n] for f, (_, counts) in enumerate(footers) for g, n in enumerate(counts) if n]
    total = sum(n for _, _, n in pieces)
    if total < np:
        raise UsageError(
            "--data: the DataFrame is empty; there is nothing to train on." if total == 0 else
            f"--data: the DataFrame has {total} row{'s' if total > 1 else ''}, fewer than the {np} "
            f"ranks; every rank needs rows of its own. Use --np {total} or more data.")
    starts = [r * total // np for r in range(np)]
    counts = [end - start for start, end in zip(starts, starts[1:] + [total])]
    stats = [_stat(uri) for uri in files]
    return {"files": list(files), "columns": columns or footers[0][0].names, "filter": spec,
            "pieces": pieces, "starts": starts, "counts": counts, "source": source,
            "stats": stats, "row_groups": len(pieces)}


def _stat(uri):
    path = stream.local_path(uri)
    try:
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns]
    except OSError:
        return None


def equalize(plan):
    """--equal-shards: every rank keeps as many rows as the smallest share."""
    least = min(plan["counts"])
    return dict(plan, counts=[least] * len(plan["counts"]))


def describe(plan, total=None):
    """What the user reads about the shards."""
    counts = plan["counts"]
    np, total = len(counts), sum(counts) if total is None else total
    low, high = min(counts), max(counts)
    where = plan["source"]
    if low == high and total == np * low:
        return f"--data: {plural(total, 'row')} in {plural(np, 'shard')} of {plural(low, 'row')} " \
               f"each, {where}"
    if low == high:
        return (f"--data: {plural(np, 'shard')} of {plural(low, 'row')} each (--equal-shards "
                f"dropped {total - np * low:,} of {plural(total, 'row')}), {where}")
    return (f"--data: {plural(total, 'row')} in {plural(np, 'shard')} of {low:,} to {high:,} "
            f"rows, {where}; every "
            f"rank gets as many batches: shards one row short repeat a row in their last batch "
            f"(drop_last=True drops the rows after the last full batch instead)")
