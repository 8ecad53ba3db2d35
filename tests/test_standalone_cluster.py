"""The same cell on a real Spark standalone cluster: one master, two workers, four ranks."""

import pytest

import hvd_magic
from conftest import ALLREDUCE_CELL


def test_allreduce_on_two_workers(ip, standalone):
    session = standalone.session()
    try:
        cell = ALLREDUCE_CELL.replace(
            "total.item()\n",
            "import os\n(total.item(), hvd.local_rank(), hvd.local_size(), hvd.cross_rank(),"
            " os.environ['HOROVOD_HOSTNAME'])\n")
        value = ip.run_cell_magic("horovod", "--np 4", cell)
        run = hvd_magic.last_run()
        assert run.where == standalone.url
        assert value[0] == 10.0
        assert [r[0] for r in run.results] == [10.0] * 4
        # ranks spread over both executors (workers on 127.0.0.1 and 127.0.0.2)
        executors = {r.executor for r in run.ranks}
        assert len(executors) == 2, executors
        # local ranks are numbered per host, as Horovod sees the hosts
        by_host = {}
        for total, local_rank, local_size, cross_rank, host in run.results:
            by_host.setdefault(host, []).append((local_rank, local_size))
        # (both workers are on this machine, and the driver sees both executors at 127.0.0.1:
        # one host to Horovod, local ranks 0..3 across the two executors)
        assert set(by_host) == {e.rsplit(":", 1)[0] for e in executors}
        for host, slots in by_host.items():
            assert sorted(s[0] for s in slots) == list(range(len(slots)))
            assert all(s[1] == len(slots) for s in slots)
    finally:
        session.stop()


def test_data_shards_on_two_workers(ip, fresh_ns, standalone, tmp_path):
    from IPython.core.error import UsageError

    session = standalone.session()
    cell = ("import hvd_magic\nt = hvd_magic.shard()\n"
            "(t.column('id').to_pylist(), sum(t.column('x').to_pylist()))")
    try:
        fresh_ns["df"] = session.range(0, 2000, 1, 5).selectExpr("id", "id * 0.5 as x")
        # not plain Parquet: converted, into a folder a cluster must be told of
        with pytest.raises(UsageError, match="Set one: %config HorovodMagics.data_cache"):
            ip.run_cell_magic("horovod", "--np 4 --data df --text", cell)
        ip.run_line_magic("config", f"HorovodMagics.data_cache = {str(tmp_path / 'cache')!r}")
        ip.run_cell_magic("horovod", "--np 4 --data df --text", cell)
        run = hvd_magic.last_run()
        ids = [i for chunk, _ in run.results for i in chunk]
        assert sorted(ids) == list(range(2000))          # disjoint, and all of them
        assert sum(x for _, x in run.results) == sum(range(2000)) * 0.5
        assert len({r.executor for r in run.ranks}) == 2  # ranks on both workers read them
    finally:
        ip.run_line_magic("config", "HorovodMagics.data_cache = ''")
        session.stop()


def test_a_large_value_reaches_each_rank_from_its_executors_broadcast_file(ip, standalone):
    session = standalone.session()
    try:
        ip.run_cell("import numpy\nbig = numpy.arange(2_000_000, dtype=numpy.float64)").raise_error()
        value = ip.run_cell_magic("horovod", "--np 4 --quiet", "(float(big.sum()), big.shape)")
        run = hvd_magic.last_run()
        assert run.broadcast_names == ["big"]  # 16 MB: a Spark broadcast on a cluster
        assert type(run._shared["big"]).__name__ == "Broadcast"
        assert value == (2_000_000 * 1_999_999 / 2, (2_000_000,))
        assert run.results == [value] * 4
    finally:
        session.stop()
