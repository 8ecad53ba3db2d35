"""How often the dashboard sends: every widget message is drawn by the front end, and the
charts read every rank's points (and memory samples) each time they are drawn.

- `Pace`: at most N widget messages in any one second;
- `ChartRedraw`: the charts drawn again only when new points or samples came, for not more than
  a tenth of the time, and a large run's at most every `interval` per 256 ranks.

Not for: what is drawn (`hvd_magic.view.charts`, `hvd_magic.view.summary`).
"""

import collections
import time

from .charts import charts_html
from .summary import band_charts_html


class Pace:
    """At most `rate` widget messages in any one second."""

    def __init__(self, rate):
        self.rate = rate
        self._sent = collections.deque()  # when each of the last `rate` messages went

    def room(self, now):
        while self._sent and now - self._sent[0] >= 1.0:
            self._sent.popleft()
        return self.rate - len(self._sent)

    def took(self, now, count):
        self._sent.extend([now] * count)


class ChartRedraw:
    """A run's charts' HTML, kept between drawings."""

    def __init__(self, interval):
        self.interval = interval  # seconds between two drawings, per 256 ranks
        self.drawn, self.key, self.when = "", None, 0.0
        self.cost = 0.0           # seconds the last drawing took: a slow one is redrawn less

    def html(self, run, banded, since=None):
        """The charts, drawn again if new points or samples came (memory alone: at most once a
        second, the newest sample's) and enough time went by; `banded`: a large run's mean and
        min-max band across ranks; `since`: the cell's start (unix time), where time begins."""
        now = time.monotonic()
        sampled = int(max(((r.usage.latest or {}).get("time") or 0 for r in run.ranks),
                          default=0))
        # (points reported: a history thinned as it grows keeps a number it had before)
        key = (sum(_reported(r.history) for r in run.ranks), sampled, banded)
        if key != self.key and now - self.when >= max(10 * self.cost,
                                                      self.interval * run.np / 256):
            self.drawn = (band_charts_html if banded else charts_html)(run.ranks, since)
            self.cost = time.monotonic() - now
            self.key, self.when = key, now
        return self.drawn


def _reported(history):
    """Points a rank reported so far (`MetricHistory.reported`; a plain list's length)."""
    reported = getattr(history, "reported", None)
    return len(history) if reported is None else reported
