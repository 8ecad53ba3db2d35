"""`MetricHistory`: every metric point one rank reported, kept in columns.

A rank's `report()` points arrive as ``[step, {name: value}]``. Kept as they come, a point costs
~350 bytes (a list, a dict, boxed numbers); 1024 ranks with 10,000 points each would hold gigabytes
in the notebook. Here each metric is two typed arrays (the index of the point it belongs to, its
value: 16 bytes a value) and the steps one more (8 bytes a point); a metric whose values are not
numbers (a tqdm postfix string) is a plain list instead. A metric reported at every point since
its first (the usual case) keeps a `range` for its indices, not an array: 8 bytes a value then.

It still reads as the list of points it replaces: ``len()`` is the number of points, iterating
gives ``[step, {name: value}]`` in order, so code written for that list works unchanged; charts and
`Run.metrics` read the columns (`columns`) directly.

Not for: the latest values (`RankState.metrics`), or anything on disk (``events.jsonl`` has them).
"""

from array import array


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class MetricHistory:
    def __init__(self, points=()):
        self._steps = array("q")       # a point's step; becomes "d" at the first float step
        self._columns = {}             # name -> (point indices: range | array("q"),
        #                                          values: array("d") | list)
        self.extend(points)

    def __len__(self):
        return len(self._steps)

    def extend(self, points):
        for point in points:
            if isinstance(point, (list, tuple)) and len(point) == 2 and isinstance(point[1], dict):
                self.append(point[0], point[1])

    def append(self, step, values):
        index = len(self._steps)
        self._add_step(step)
        for name, value in values.items():
            column = self._columns.get(name)
            if column is None:
                column = (range(index, index), array("d") if _is_number(value) else [])
            indices, column_values = column
            if isinstance(column_values, array) and not _is_number(value):
                column_values = list(column_values)  # a value that is not a number: a list now
            if isinstance(indices, range) and index == indices.stop:
                indices = range(indices.start, index + 1)  # still at every point: no array
            else:
                if isinstance(indices, range):
                    indices = array("q", indices)
                indices.append(index)
            column_values.append(value)
            self._columns[name] = (indices, column_values)

    def _add_step(self, step):
        if self._steps.typecode == "q":
            if isinstance(step, int) and not isinstance(step, bool) and -2**63 <= step < 2**63:
                self._steps.append(step)
                return
            if isinstance(step, float):
                self._steps = array("d", self._steps)
            else:  # None, a string: keep the point with no step a chart can use
                self._steps = array("d", self._steps)
                step = float("nan")
        try:
            self._steps.append(step)
        except TypeError:
            self._steps.append(float("nan"))

    def _step(self, index):
        step = self._steps[index]
        return int(step) if self._steps.typecode == "d" and step.is_integer() else step

    def columns(self):
        """{name: (steps, values)}: each metric's own steps and values, in the order reported."""
        out = {}
        for name, (indices, values) in self._columns.items():
            out[name] = ([self._step(i) for i in indices], values)
        return out

    def numeric(self):
        """{name: (steps, values)} of the metrics whose values are all numbers, as arrays (the
        charts'); a point reported without a usable step has a NaN step."""
        out = {}
        for name, (indices, values) in self._columns.items():
            if isinstance(values, array):
                if len(indices) == len(self._steps):  # reported at every point: no copy
                    out[name] = (self._steps, values)
                elif isinstance(indices, range):
                    out[name] = (self._steps[indices.start:indices.stop], values)
                else:
                    out[name] = (array("d", (self._steps[i] for i in indices)), values)
        return out

    def __iter__(self):
        """``[step, {name: value}]`` per point, as reported (the list this replaces)."""
        points = [[self._step(i), {}] for i in range(len(self._steps))]
        for name, (indices, values) in self._columns.items():
            for i, value in zip(indices, values):
                points[i][1][name] = value
        return iter(points)

    def __eq__(self, other):
        return list(self) == list(other)

    def __repr__(self):
        return f"<MetricHistory {len(self)} points of {', '.join(self._columns)}>"

    def nbytes(self):
        """Bytes held by the columns (not counting lists of non-numbers' objects)."""
        size = self._steps.itemsize * len(self._steps)
        for indices, values in self._columns.values():
            size += indices.itemsize * len(indices) if isinstance(indices, array) else 0
            size += values.itemsize * len(values) if isinstance(values, array) else 8 * len(values)
        return size
