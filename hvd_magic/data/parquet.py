"""Is a DataFrame a plain scan of Parquet files? Then the ranks read those files themselves.

Classic Spark: the optimized logical plan must be a Parquet ``LogicalRelation`` (not
partitioned, not bucketed; Delta's own file format is not plain Parquet: its deletion vectors and
column mapping change what the files mean), under at most a ``Filter`` whose condition
translates exactly into a pyarrow expression and a ``Project`` of plain columns. Spark
Connect shows only the plan's text: there a ``Relation ... parquet`` under at most a
``Project`` of plain columns is direct, and a filter is left to Spark.

Anything else (joins, UDFs, aggregations, casts, other formats) is not direct: `scan` says why,
and the DataFrame is converted once instead (`hvd_magic.data.cache`).
"""

import re

from ..compat import pyspark as pyspark_compat

_COMPARISONS = {"EqualTo": "==", "LessThan": "<", "LessThanOrEqual": "<=", "GreaterThan": ">",
                "GreaterThanOrEqual": ">="}
_LITERAL_TYPES = {"integer", "long", "short", "byte", "double", "float", "string", "boolean"}


class NotDirect(Exception):
    """Why a DataFrame is not a plain Parquet scan."""


def scan(df):
    """(Parquet file URIs, columns, filter spec) of a plain Parquet scan; NotDirect otherwise."""
    jdf = pyspark_compat.java_dataframe(df)
    if jdf is not None:
        return _classic(jdf.queryExecution().optimizedPlan())
    return _connect(df)


def _name(obj):
    return obj.getClass().getSimpleName()


def _seq(seq):
    return [seq.apply(i) for i in range(seq.size())]


def _classic(plan):
    columns, spec = None, None
    if _name(plan) == "Project":
        items = _seq(plan.projectList())
        if any(_name(e) != "AttributeReference" for e in items):
            raise NotDirect("it computes columns")
        columns = [e.name() for e in items]
        plan = plan.child()
    if _name(plan) == "Filter":
        spec = _condition(plan.condition())
        plan = plan.child()
    if _name(plan) != "LogicalRelation":
        raise NotDirect(f"its plan has a {_name(plan)}")
    relation = plan.relation()
    if _name(relation) != "HadoopFsRelation":
        raise NotDirect(f"it reads a {_name(relation)}")
    file_format = _name(relation.fileFormat())
    if file_format != "ParquetFileFormat":
        raise NotDirect(f"its files are {file_format.replace('FileFormat', '')}, not plain Parquet")
    if relation.partitionSchema().size() or relation.bucketSpec().isDefined():
        raise NotDirect("its table is partitioned or bucketed")
    files = list(relation.location().inputFiles())
    if columns is None:
        columns = [a.name() for a in _seq(plan.output())]
    return files, columns, spec


def _condition(expr):
    kind = _name(expr)
    if kind in ("And", "Or"):
        return [kind.lower(), _condition(expr.left()), _condition(expr.right())]
    if kind == "Not":
        return ["not", _condition(expr.child())]
    if kind in ("IsNull", "IsNotNull"):
        return ["is_null" if kind == "IsNull" else "is_valid", _column(expr.child())]
    if kind in _COMPARISONS:
        left, right = expr.left(), expr.right()
        if _name(left) == "Literal":  # 5 < x is x > 5
            flip = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "=="}
            return [flip[_COMPARISONS[kind]], _column(right), _literal(left)]
        return [_COMPARISONS[kind], _column(left), _literal(right)]
    if kind == "In":
        return ["isin", _column(expr.value()), [_literal(v) for v in _seq(expr.list())]]
    raise NotDirect(f"its filter uses {kind}")


def _column(expr):
    if _name(expr) != "AttributeReference":
        raise NotDirect(f"its filter computes {_name(expr)}")
    return expr.name()


def _literal(expr):
    if _name(expr) != "Literal":
        raise NotDirect(f"its filter compares with {_name(expr)}")
    kind = expr.dataType().typeName()
    if kind not in _LITERAL_TYPES:
        raise NotDirect(f"its filter compares with a {kind}")
    value = expr.value()
    if value is None:
        raise NotDirect("its filter compares with null")
    value = str(value) if kind == "string" else value
    if kind in ("double", "float") and value != value:
        raise NotDirect("its filter compares with NaN")
    return value


_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*#\d+L?$")


def _connect(df):
    text = pyspark_compat.explain_text(df)
    plan = text.split("== Optimized Logical Plan ==", 1)[-1].split("== Physical Plan ==", 1)[0]
    lines = [line.strip().lstrip("+- ").strip() for line in plan.strip().splitlines()]
    columns = None
    if lines and lines[0].startswith("Project ["):
        items = [i.strip() for i in lines[0][len("Project ["):].rsplit("]", 1)[0].split(",")]
        if not all(_PLAIN.match(i) for i in items):
            raise NotDirect("it computes columns")
        columns = [i.split("#")[0] for i in items]
        lines = lines[1:]
    if len(lines) != 1 or not lines[0].startswith("Relation ") or not lines[0].endswith(" parquet"):
        head = lines[0].split(" ")[0] if lines else "nothing"
        raise NotDirect(f"its plan has a {head}")
    files = list(df.inputFiles())
    if any("=" in f.rsplit("/", 2)[-2] for f in files if "/" in f):
        raise NotDirect("its table is partitioned")
    if columns is None:
        columns = list(df.columns)
    return files, columns, None
