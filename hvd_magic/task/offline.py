"""When the executors cannot reach the notebook (Spark Connect to a remote cluster, behind NAT):
the run goes on without a live link, and everything the driver would have heard comes back
through Spark at the end.

Only launches through Spark Connect can be in that position (a classic Spark driver is the
notebook itself, which the executors always reach). Their tasks first try the driver's event
server for `REACH_TIMEOUT` seconds, then agree (one barrier ``allGather``) on whether all of them
got through: a run is live for every rank, or for none. Offline, an `OfflineLink` stands in for
`DriverLink`: events go to a local file (returned with the outcome); what the tasks serve and
reserve for the rendezvous (their ports) is exchanged with ``allGather`` instead of through the
driver.
"""

import json
import socket
import threading

from ..events import EventClient
from ..frameworks import Gathering
from .link import DriverLink, Forwarder

REACH_TIMEOUT = 3.0


def reach_driver(settings, coord):
    """(an `EventClient` to the driver, or None when some task could not reach it, why)."""
    try:
        client = EventClient(settings.events_address, settings.token, timeout=REACH_TIMEOUT)
        why = ""
    except OSError as exc:
        client, why = None, f"{type(exc).__name__}: {exc}"
    votes = coord.ctx.allGather(why)
    if all(vote == "" for vote in votes):
        return client, ""
    if client is not None:
        client.close()
    return None, next(vote for vote in votes if vote)


class _FileClient:
    """`EventClient`'s `send`, into a local file of JSON lines."""

    def __init__(self, path):
        self.path = path
        self._file = open(path, "w", encoding="utf-8")
        self._lock = threading.Lock()

    def send(self, event):
        with self._lock:
            self._file.write(json.dumps(event, separators=(",", ":")) + "\n")

    def close(self):
        with self._lock:
            self._file.close()


class OfflineLink(DriverLink):
    """A `DriverLink` for a task that cannot reach the driver: events to `events_path`; what the
    driver would have relayed, from the other tasks through Spark's barrier ``allGather``."""

    def __init__(self, settings, rank, coord, events_path, why):
        self.proc = None
        self.relayed = None
        self.session = None
        self.stopping = threading.Event()
        self.signalled = set()
        self._rendezvous = threading.Event()
        self.coord = coord
        self.np = settings.np
        self._mine = {}              # what this task would have told the driver, by event kind
        self.client = _FileClient(events_path)
        self.forward = Forwarder(self, rank)
        self.forward.send({"t": "offline", "address": settings.events_address, "why": why,
                           "host": socket.gethostname()})

    def send(self, event):  # (the Forwarder's client)
        if event.get("t") == "rendezvous":
            self._mine[event["t"]] = event
        self.client.send(event)

    def wait_rendezvous(self, timeout):
        gathering = Gathering(self.np)
        relayed = None
        for event in self.coord.ctx.allGather(json.dumps(self._mine["rendezvous"])):
            event = json.loads(event)
            relayed = gathering.add(event["rank"], event)
        return relayed

    def close(self):
        self.client.close()
