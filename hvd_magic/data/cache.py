"""DataFrames converted once: Spark's own Parquet writer, into a cache directory, reused.

An entry's name is a hash of the DataFrame's plan and of its input files' paths, sizes and
modification times. The plan: the full text of its canonical form (which ignores the ids Spark
gives columns each time a DataFrame is made), plus what that text leaves out (each file scan's
format, schemas and options; the session's SQL settings); ``semanticHash``, which differs per JVM,
only where the plan holds what its text cannot tell apart (UDFs, driver-side rows, Spark Connect).
So the same DataFrame in a later cell, or a later run of the notebook, finds its entry; changed
input files make a new one, never a stale read. An entry is written under a temporary name and
renamed when complete, so a killed kernel leaves no entry half-written (`entries` sweeps the
temporary folders of processes that are gone). An entry whose files were deleted or rewritten
since is converted again.

The directory: ``HorovodMagics.data_cache`` (``%config``; ``data_cache=`` in the API), else
``$HVD_MAGIC_DATA_CACHE`` or ``~/.cache/hvd_magic/data`` when Spark runs on this machine
(``local[N]``). On a cluster it must
be a directory every executor and this notebook see at the same path (a shared mount).
"""

import hashlib
import json
import os
import shutil
import time
import uuid

from IPython.core.error import UsageError

from ..compat import pyspark as pyspark_compat

MANIFEST = "_hvd_magic.json"
ROW_GROUP_MB = 16


def default_dir():
    if os.environ.get("HVD_MAGIC_DATA_CACHE"):
        return os.environ["HVD_MAGIC_DATA_CACHE"]
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "hvd_magic", "data")


def cache_dir(configured, local):
    """The directory to convert into; a UsageError on a cluster without one configured."""
    if configured:
        return os.path.abspath(os.path.expanduser(configured))
    if local:
        return default_dir()
    raise UsageError(
        "--data: this DataFrame is not a plain Parquet scan, so Spark converts it once into a "
        "cache directory that every executor and this notebook must see at the same path. Set "
        "one: %config HorovodMagics.data_cache = '/shared/path' (or data_cache= in the API).")


def _inputs(df):
    """(path, size, mtime) of each input file Spark lists; files it cannot stat count by name."""
    from ..rank.stream import local_path

    stats = []
    for uri in sorted(df.inputFiles()):
        try:
            st = os.stat(local_path(uri))
            stats.append((uri, st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append((uri, None, None))
    return stats


# Plan nodes whose text in the canonical plan says all they compute (file scans add what the text
# leaves out, see `_relation`); anything else (rows held in the driver, RDDs, catalogs' tables)
# keys by `semanticHash`, which differs per JVM but never matches a different DataFrame.
_KNOWN_LEAVES = ("org.apache.spark.sql.execution.datasources.LogicalRelation",
                 "org.apache.spark.sql.catalyst.plans.logical.Range",
                 "org.apache.spark.sql.catalyst.plans.logical.OneRowRelation")
# Expressions and nodes that carry code or data their text only names (a UDF shows its name, not
# its function). Subqueries are walked: they are a plan's inner children.
_OPAQUE = ("UDF", "UDAF", "UDTF", "Python", "Pandas", "Arrow", "Object", "MapElements",
           "MapPartitions", "AppendColumns", "Invoke", "Aggregator")


def _seq(jseq):
    return [jseq.apply(i) for i in range(jseq.size())]


def _pairs(jmap):
    """A Scala map's (key, value) pairs, sorted."""
    pairs, it = [], jmap.iterator()
    while it.hasNext():
        pair = it.next()
        pairs.append((pair._1(), pair._2()))
    return sorted(pairs)


def _relation(node):
    """What a file scan's text leaves out: format, schemas, buckets, options, root paths."""
    rel = node.relation()
    if not rel.getClass().getName().endswith(".HadoopFsRelation"):
        raise ValueError(rel.getClass().getName())
    return [rel.fileFormat().getClass().getName(), rel.dataSchema().json(),
            rel.partitionSchema().json(), rel.bucketSpec().toString(), _pairs(rel.options()),
            sorted(p.toString() for p in _seq(rel.location().rootPaths()))]


def _stable_plan(df):
    """The canonical plan's full text and every file scan's details, the same in any JVM; None
    when the plan holds something that text cannot tell apart (then the caller falls back)."""
    jvm = pyspark_compat.jvm()
    plan = pyspark_compat.java_dataframe(df).queryExecution().analyzed().canonicalized()
    is_plan = jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.plans.QueryPlan")
    scans, todo = [], [plan]
    while todo:
        node = todo.pop()
        name = node.getClass().getName()
        if any(word in name.rsplit(".", 1)[-1] for word in _OPAQUE):
            return None
        children = _seq(node.children()) + _seq(node.innerChildren())
        if is_plan.isInstance(node):
            if not children and name not in _KNOWN_LEAVES:
                return None
            if name.endswith(".LogicalRelation"):
                scans.append(_relation(node))
            children += _seq(node.expressions())
        todo.extend(children)
    # Spark 4 takes a fifth argument (printOutputColumns); 3.x four.
    try:
        text = plan.treeString(True, False, 2**31 - 1, False, False)
    except Exception:  # py4j: no such overload
        text = plan.treeString(True, False, 2**31 - 1, False)
    return [text, json.dumps(scans), json.dumps(_sql_confs(df))]


def _sql_confs(df):
    """The session's SQL settings, which the text leaves out of what they change (a cast to string
    shows no time zone, nor whether it is ANSI); the warehouse directory follows the working
    directory and reaches a plan only as a table's path, which the scans' paths already hold."""
    conf = pyspark_compat.java_session(df.sparkSession).sessionState().conf()
    return [("time zone", conf.sessionLocalTimeZone())] + [
        (k, v) for k, v in _pairs(conf.getAllConfs())
        if k.startswith("spark.sql.") and k != "spark.sql.warehouse.dir"]


def key(df):
    """The entry name for `df`: its plan and its input files.

    Classic Spark: the canonical plan's text (expression ids numbered in order, no object ids)
    plus what that text does not show of each file scan, so a new kernel finds the entry. Spark
    Connect has no plan to read here: its ``semanticHash`` is computed by the server, stable while
    that server runs. Either way a plan this cannot read whole keys by ``semanticHash``: a miss in
    the next kernel, never a wrong match."""
    stable, jdf = None, pyspark_compat.java_dataframe(df)
    if jdf is not None:
        try:
            stable = _stable_plan(df)
        except Exception:  # py4j: a node without the method read; ValueError: not a file relation
            stable = None
    if stable is not None:
        parts = ["plan-text", df.schema.json(), *stable]
    else:
        parts = [str(df.semanticHash()), df.schema.json()]
        if jdf is not None:
            parts.append(jdf.queryExecution().analyzed().canonicalized().toString())
    parts.append(json.dumps(_inputs(df)))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _intact(entry):
    """The entry's files, when its manifest says they are all there unchanged."""
    try:
        with open(os.path.join(entry, MANIFEST)) as f:
            manifest = json.load(f)
        for name, size in manifest["files"].items():
            if os.path.getsize(os.path.join(entry, name)) != size:
                return None
    except (OSError, ValueError, KeyError):
        return None
    return ["file://" + os.path.join(entry, name) for name in sorted(manifest["files"])]


def converted(df, directory):
    """The Parquet files of `df` in the cache: (file URIs, reused?)."""
    os.makedirs(directory, exist_ok=True)
    entry = os.path.join(directory, key(df))
    files = _intact(entry)
    if files is not None:
        return files, True
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        # Row groups of ROW_GROUP_MB: what a rank reads at a time (Spark's 128 MB default would
        # make a rank read far past its share, and hold that much while streaming).
        df.write.option("parquet.block.size", ROW_GROUP_MB << 20).parquet(
            "file://" + tmp if "://" not in tmp else tmp)
        names = sorted(n for n in (os.listdir(tmp) if os.path.isdir(tmp) else [])
                       if n.endswith(".parquet"))
        if not names:
            raise UsageError(
                f"--data: Spark wrote the DataFrame into {directory}, but this notebook sees no "
                "file there: the executors cannot write where this machine reads. Set "
                "%config HorovodMagics.data_cache to a directory that every executor and this "
                "notebook share (the same path on every machine).")
        manifest = {"files": {n: os.path.getsize(os.path.join(tmp, n)) for n in names},
                    "created": time.time(), "columns": df.columns}
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f)
        shutil.rmtree(entry, ignore_errors=True)  # (damaged: files deleted or rewritten)
        try:
            os.rename(tmp, entry)
        except OSError:  # another process finished the same entry first: use its
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = _intact(entry)
    if files is None:
        raise UsageError(f"--data: the converted DataFrame in {entry} changed while it was "
                         "being written; run the cell again.")
    return files, False


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def entries(directory):
    """[(name, MB, files, created)] of the cache's complete entries; leftovers of processes that
    died while converting are removed."""
    if not os.path.isdir(directory):
        return []
    rows = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name.startswith(".tmp-"):
            pid = int(name.split("-")[1]) if name.split("-")[1].isdigit() else 0
            if not _alive(pid):
                shutil.rmtree(path, ignore_errors=True)
            continue
        try:
            with open(os.path.join(path, MANIFEST)) as f:
                manifest = json.load(f)
        except (OSError, ValueError):
            continue
        size = sum(manifest["files"].values())
        rows.append((name, size / 1e6, len(manifest["files"]), manifest.get("created", 0.0)))
    return rows


def clear(directory, name=None):
    """Remove every entry (or the one called `name`); how many were removed."""
    removed = 0
    for entry, *_ in entries(directory):
        if name is None or entry == name:
            shutil.rmtree(os.path.join(directory, entry), ignore_errors=True)
            removed += 1
    return removed
