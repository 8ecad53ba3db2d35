"""`MetricHistory`: the metric points one rank reported, in typed columns, thinned as they grow.

A rank's `report()` points arrive as ``[step, {name: value}]``. Kept as they come, a point costs
~350 bytes (a list, a dict, boxed numbers); 1024 ranks with 10,000 points each would hold gigabytes
in the notebook. Here each metric is a column: typed arrays of its steps, its values (a metric
whose values are not numbers, a tqdm postfix string, keeps a plain list) and the number of the
point each value came in (so the points read back as they were reported): 24 bytes a value.

And a column keeps at most `KEEP` values, however long the run: when it is full, its older values
are kept at a stride (every 2nd, later every 4th, ...; its first value always) and its newest
`RECENT` at full rate, as `hvd_magic.driver.usage` thins its samples. The charts still span the
whole run, at a coarser step, and show its end in full; a rank holds at most ~24 KB a metric
(1024 ranks, 2 metrics: 50 MB). Thinned per metric, not per point: a metric reported once an
epoch keeps all its values while a per-step one is thinned. Every point is still in the run
folder's ``events.jsonl``: `columns` (what `Run.metrics` reads) reads a thinned history back from
there (`read_back`, set by the driver), complete.

It still reads as the list of points it replaces: ``len()`` is the number of points kept,
iterating gives ``[step, {name: value}]`` in order; charts read `numeric`.

Not for: the latest values (`RankState.metrics`).
"""

from array import array

KEEP = 1024     # values a metric keeps at most
RECENT = 128    # its newest values, kept at full rate when it is thinned


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numbers(values):
    """True if every value is a number (the types looked at first: this is per value)."""
    return set(map(type, values)) <= {float, int} or all(map(_is_number, values))


def _float_step(step):
    """A step an array of floats can hold: NaN for None, a string, a number past a float's."""
    if not _is_number(step):
        return float("nan")
    try:
        return float(step)
    except OverflowError:
        return float("nan")


class _Column:
    """One metric's kept values. Its k-th value is kept while it is among the newest, and for
    good if k is a multiple of `every`: the first `grid` kept values are its values number 0,
    every, 2 every..., the others its newest values, in a row up to the latest."""

    __slots__ = ("steps", "values", "points", "count", "every", "grid", "keep")

    def __init__(self, keep):
        self.keep = keep              # values kept at most (None: all)
        self.steps = array("q")       # becomes "d" at the first step that is not an integer
        self.values = array("d")      # becomes a list at the first value that is not a number
        self.points = array("q")      # the number of the point each value came in
        self.count = 0                # values reported, kept or not
        self.every = 1
        self.grid = 0

    def add(self, points, steps, values):
        """Append values (each with its point's number and step), in the order reported."""
        self.count += len(values)
        self.points.extend(points)
        self._add_steps(steps)
        if isinstance(self.values, array):
            before = len(self.values)
            try:
                if _numbers(values):
                    self.values.extend(values)
                    values = ()
            except OverflowError:  # an integer past a float's range
                del self.values[before:]
            if values:
                self.values = list(self.values)  # a value that is not a number: a list now
        self.values.extend(values)
        if self.keep is not None and len(self.points) > self.keep:
            self._thin()

    def _add_steps(self, steps):
        if self.steps.typecode == "q" and set(map(type, steps)) <= {int}:
            before = len(self.steps)
            try:
                self.steps.extend(steps)
                return
            except OverflowError:
                del self.steps[before:]
        if self.steps.typecode == "q":
            self.steps = array("d", self.steps)
        self.steps.extend(map(_float_step, steps))

    def _thin(self):
        """Keep the values on the grid (at most half of `keep`: the stride doubles until they
        fit) and the newest (a quarter of `keep`, at most RECENT)."""
        first = self.count - (len(self.points) - self.grid)  # the number of the first in a row
        recent = self.count - min(RECENT, self.keep // 4)    # ... and of the first kept in full
        grid = list(range(self.grid)) + [self.grid + k - first for k in range(
            self.grid * self.every, recent, self.every)]     # the values that join the grid
        while len(grid) > self.keep // 2:
            grid = grid[::2]
            self.every *= 2
        kept = grid + list(range(self.grid + recent - first, len(self.points)))
        self.grid = len(grid)
        self.steps = array(self.steps.typecode, [self.steps[i] for i in kept])
        self.points = array("q", [self.points[i] for i in kept])
        values = [self.values[i] for i in kept]
        self.values = array("d", values) if isinstance(self.values, array) else values

    def nbytes(self):
        size = self.steps.itemsize * len(self.steps) + self.points.itemsize * len(self.points)
        return size + (self.values.itemsize if isinstance(self.values, array) else 8) \
            * len(self.values)


class MetricHistory:
    """One rank's metric points (`RankState.history`): a column per metric, each thinned."""

    def __init__(self, points=(), keep=KEEP):
        self._columns = {}       # name -> _Column
        self.reported = 0        # points reported, kept or not: grows with every new point
        self.keep = keep         # values a metric keeps at most (None: all, a history read back)
        self.read_back = None    # () -> the rank's whole MetricHistory (run folder) or None
        self.extend(points)

    def __len__(self):
        return len(set().union(*(column.points for column in self._columns.values())))

    def extend(self, points):
        """Add ``[step, {name: value}]`` points (what is not one is skipped). Returns the latest
        value of each metric among them ({name: value}, in the order they first came)."""
        points = [point for point in points if isinstance(point, (list, tuple))
                  and len(point) == 2 and isinstance(point[1], dict)]
        if not points:
            return {}
        numbers = range(self.reported, self.reported + len(points))
        self.reported += len(points)
        names = points[0][1].keys()
        if all(point[1].keys() == names for point in points):  # the same metrics in each
            steps = [point[0] for point in points]
            added = {name: (numbers, steps, [point[1][name] for point in points])
                     for name in names}
        else:
            added = {}
            for number, (step, values) in zip(numbers, points):
                for name, value in values.items():
                    column = added.get(name)
                    if column is None:
                        column = added[name] = ([], [], [])
                    column[0].append(number)
                    column[1].append(step)
                    column[2].append(value)
        for name, column_added in added.items():
            column = self._columns.get(name)
            if column is None:
                column = self._columns[name] = _Column(self.keep)
            column.add(*column_added)
        return {name: values[-1] for name, (_, _, values) in added.items()}

    def append(self, step, values):
        self.extend([(step, values)])

    def thinned(self):
        """True once a value was left out here (then `columns` reads the run folder)."""
        return any(len(column.points) < column.count for column in self._columns.values())

    def columns(self):
        """{name: (steps, values)}: each metric's steps and values, in the order reported; all
        of them (read back from the run folder if some were thinned here and it can be read)."""
        whole = self.read_back() if self.read_back is not None and self.thinned() else None
        history = self if whole is None else whole
        return {name: ([_step(column.steps, i) for i in range(len(column.steps))], column.values)
                for name, column in history._columns.items()}

    def numeric(self):
        """{name: (steps, values)} of the metrics whose values are all numbers, as arrays (the
        charts'): the values kept; a point reported without a usable step has a NaN step."""
        return {name: (column.steps, column.values) for name, column in self._columns.items()
                if isinstance(column.values, array)}

    def __iter__(self):
        """``[step, {name: value}]`` per point kept, as reported (the list this replaces)."""
        points = {}
        for name, column in self._columns.items():
            for i, (point, value) in enumerate(zip(column.points, column.values)):
                points.setdefault(point, [_step(column.steps, i), {}])[1][name] = value
        return iter([points[point] for point in sorted(points)])

    def __eq__(self, other):
        return list(self) == list(other)

    def __repr__(self):
        return f"<MetricHistory {len(self)} points of {', '.join(self._columns)}>"

    def nbytes(self):
        """Bytes held by the columns (not counting lists of non-numbers' objects)."""
        return sum(column.nbytes() for column in self._columns.values())


def _step(steps, index):
    step = steps[index]
    return int(step) if steps.typecode == "d" and step.is_integer() else step
