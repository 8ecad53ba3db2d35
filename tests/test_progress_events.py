"""What a rank's progress costs the cores it shares with its peers (#82): the events held back by
the throttle are sent by one thread of the rank, not a thread per interval, and a framework's own
step count (DeepSpeed's ``engine.step()``) goes at most every `STEP_INTERVAL`, its latest
always. In this process, over a real pipe, as a rank writes to its task."""

import json
import os
import threading
import time

import pytest

from hvd_magic.rank import reporting


@pytest.fixture
def channel(monkeypatch):
    """This process's progress channel on a fresh pipe: (the channel, a function that reads the
    events written so far)."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    channel = reporting._Channel()
    channel.fd = write_end
    monkeypatch.setattr(reporting, "_channel", channel)
    monkeypatch.setattr(reporting, "_cell_reports_steps", False)

    def events():
        data = b""
        while True:
            try:
                chunk = os.read(read_end, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
        return [json.loads(line) for line in data.splitlines()]

    yield channel, events
    os.close(read_end)
    os.close(write_end)


def until_sent(channel, limit=30.0):
    deadline = time.monotonic() + limit  # (a loaded host runs the sender late)
    while channel.pending is not None and time.monotonic() < deadline:
        time.sleep(0.01)


def steps_for(seconds, call):
    start, step = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        step += 1
        call(step)
        time.sleep(0.001)
    return step, time.monotonic() - start


def test_held_back_progress_goes_from_one_thread_of_the_rank(channel):
    channel, events = channel
    writers = []
    write = channel.write

    def noted(event):
        writers.append(threading.get_native_id())
        write(event)
    channel.write = noted

    last, _ = steps_for(0.6, lambda step: reporting.report(step=step, total=None, loss=1 / step))
    until_sent(channel)
    sent = events()
    assert sent[-1]["step"] == last  # the latest, sent once its interval was over
    senders = set(writers) - {threading.get_native_id()}
    assert len(senders) == 1, f"{len(senders)} threads sent the held-back events"
    assert sum(len(e.get("points", ())) for e in sent) == last  # every point, once


def test_a_frameworks_step_count_goes_four_times_a_second_and_its_latest_follows(channel):
    channel, events = channel
    last, seconds = steps_for(1.0, reporting.framework_step)
    until_sent(channel)
    sent = events()
    assert [e["step"] for e in sent] == sorted({e["step"] for e in sent})
    assert sent[-1]["step"] == last
    assert len(sent) <= seconds / reporting.STEP_INTERVAL + 2, f"{len(sent)} in {seconds:.2f} s"
    # (a cell's own report keeps its ten a second)
    assert reporting.MIN_INTERVAL < reporting.STEP_INTERVAL
