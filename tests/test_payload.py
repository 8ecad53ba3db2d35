"""A large value reaches a rank from its executor's one broadcast file (hvd_magic/payload.py);
the end-to-end check is test_capture's test_large_value_travels_by_broadcast_..."""

import os
import pickle

from hvd_magic import payload


class ExecutorBroadcast:
    """What PySpark's worker holds for a broadcast: the file Spark left on the executor."""

    def __init__(self, path):
        self._path = path

    @property
    def value(self):
        raise AssertionError("the task must not unpickle the value itself")


def test_a_broadcast_file_is_referred_to_not_copied(tmp_path):
    data = pickle.dumps(list(range(1000)))
    path = tmp_path / "broadcast1"
    with open(path, "wb") as f:
        pickle.dump(data, f, pickle.HIGHEST_PROTOCOL)  # as PySpark's Broadcast.dump writes it
    for_rank = payload.for_rank(ExecutorBroadcast(str(path)))
    assert for_rank == {payload.FILE_KEY: str(path)}
    assert len(pickle.dumps(for_rank)) < 200
    assert payload.load(for_rank) == list(range(1000))


def test_bytes_and_values_without_a_file_travel_as_bytes(tmp_path):
    data = pickle.dumps({"a": 1})
    assert payload.for_rank(data) == data  # driver-only ranks: `share` kept the bytes
    assert payload.load(data) == {"a": 1}

    class Streamed:  # broadcast encryption on: no file, the value came over a socket
        _path = None
        value = data
    assert payload.for_rank(Streamed()) == data

    class Gone:  # the file is not there (any more): the value as Spark gives it
        _path = str(tmp_path / "gone")
        value = data
    assert payload.for_rank(Gone()) == data


def test_a_local_file_is_written_once_and_removed_at_release():
    data = pickle.dumps(bytearray(b"x" * 100_000), protocol=5)
    shared = payload.LocalFile(data)
    task_copy = pickle.loads(pickle.dumps(shared))  # what a task gets: the path only
    assert len(pickle.dumps(shared)) < 300
    for_rank = payload.for_rank(task_copy)
    assert payload.load(for_rank) == bytearray(b"x" * 100_000)
    task_copy.release()  # a task's copy never removes it
    assert os.path.exists(shared.path)
    payload.release(shared)
    assert not os.path.exists(shared.path)


def test_driver_only_ranks_read_a_large_value_from_one_file():
    import hvd_magic
    big = bytes(range(256)) * 40_000  # 10 MB: above the broadcast threshold

    def check(value):
        return len(value), value[:3]

    run = hvd_magic.run(check, np=-2, kwargs={"value": big})
    assert run.broadcast_names == ["value"]
    assert run.results == [(len(big), big[:3])] * 2
    assert isinstance(run._shared["value"], payload.LocalFile)
    assert not os.path.exists(run._shared["value"].path)  # removed when the run ended

    import numpy as np
    array = np.ones((1000, 1000))  # 8 MB: mapped from the file on each rank, writable there

    def total(value):
        value *= 2
        return float(value.sum())
    run = hvd_magic.run(total, np=-2, kwargs={"value": array})
    assert run._shared["value"].mapped
    assert run.results == [2e6, 2e6] and array[0, 0] == 1.0


def test_a_large_array_is_shared_without_a_copy_and_mapped_copy_on_write():
    import numpy as np
    big = np.arange(2_000_000, dtype=np.float64)  # 16 MB
    data = payload.dumps(big)
    assert isinstance(data, payload.OutOfBand)
    assert len(data.head) < 1000 and len(data) > big.nbytes
    assert np.shares_memory(np.frombuffer(data.buffers[0], dtype=np.float64), big)  # no copy
    assert isinstance(payload.dumps(big[::2]), bytes)        # not contiguous: the plain pickle
    assert isinstance(payload.dumps(np.arange(10)), bytes)   # small: the plain pickle
    shared = payload.LocalFile(data)
    task_copy = pickle.loads(pickle.dumps(shared))
    first, second = (payload.load(payload.for_rank(task_copy)) for _ in range(2))
    assert np.array_equal(first, big) and first.flags.writeable and first.flags.aligned
    first[0] = -1.0   # a rank writes to its value: its own page, the file keeps the value
    assert second[0] == 0.0 and payload.load(payload.for_rank(task_copy))[0] == 0.0
    assert np.array_equal(pickle.loads(payload.inband(data)), big)  # where bytes must travel
    payload.release(shared)
    assert not os.path.exists(shared.path)


def test_code_keeps_its_file_name_whatever_cloudpickle_does():
    """A cell's function keeps the file name it was compiled with (cloudpickle >= 3.1.3 writes
    "<dynamic-code>"), nested code too: a rank's traceback finds the cell's lines by it."""
    import pickle

    namespace = {}
    exec(compile("def outer():\n    def inner():\n        return 1 / 0\n    return inner\n",
                 "<hvd_magic cell 7>", "exec"), namespace)
    loaded = pickle.loads(payload.cloud_dumps(namespace["outer"]))
    assert loaded.__code__.co_filename == "<hvd_magic cell 7>"
    assert loaded().__code__.co_filename == "<hvd_magic cell 7>"
