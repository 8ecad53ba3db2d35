"""The environment a rank starts from: Spark's worker-only PYTHONPATH entries are dropped, the
user's own entries kept (hvd_magic/task/environ.py)."""

import os

from hvd_magic.task import environ


def test_spark_entries_go_and_the_users_stay(monkeypatch, tmp_path):
    spark = tmp_path / "pyspark"
    path = os.pathsep.join([f"{spark}/python/lib/pyspark.zip", f"{spark}/python/lib/py4j-0.10.9.9-src.zip",
                            f"{spark}/jars/spark-core_2.13-4.3.0.jar", "/home/me/lib", "/opt/x.zip"])
    monkeypatch.setattr(environ, "_pyspark_installed", lambda: True)
    env = environ.rank_base_env({"PYTHONPATH": path, "SPARK_HOME": str(spark), "OTHER": "1"})
    assert env["PYTHONPATH"] == os.pathsep.join(["/home/me/lib", "/opt/x.zip"])
    assert env["OTHER"] == "1"


def test_zips_stay_where_pyspark_is_only_in_them(monkeypatch):
    monkeypatch.setattr(environ, "_pyspark_installed", lambda: False)
    path = "/spark/python/lib/pyspark.zip:/spark/python/lib/py4j-0.10.9.9-src.zip:/spark/jars/core.jar"
    env = environ.rank_base_env({"PYTHONPATH": path, "SPARK_HOME": "/spark"})
    assert env["PYTHONPATH"] == "/spark/python/lib/pyspark.zip:/spark/python/lib/py4j-0.10.9.9-src.zip"


def test_nothing_changes_outside_spark():
    env = {"PYTHONPATH": "/a:/b.zip", "HOME": "/root"}
    assert environ.rank_base_env(env) == env
    assert "PYTHONPATH" not in environ.rank_base_env({"PYTHONPATH": "/s/core.jar", "SPARK_HOME": "/s"})
    assert environ._pyspark_installed()  # this venv has pip's pyspark


def test_horovod_dynamic_mode_only_for_jobs_naming_the_window_helper():
    # Named without the word in lower case: the check looks for it in the pickled function.
    import hvd_magic
    from hvd_magic.driver.run import may_record_window

    def read_env():
        import os
        return os.environ.get("HOROVOD_TIMELINE")
    assert hvd_magic.run(read_env, np=-1).value is None

    def window():
        import os
        import hvd_magic
        hvd_magic.timeline  # noqa: B018 (named: the job may record a window)
        return os.environ.get("HOROVOD_TIMELINE")
    assert hvd_magic.run(window, np=-1).value == "DYNAMIC"
    assert hvd_magic.run(read_env, np=-1, env={"HOROVOD_TIMELINE": "DYNAMIC"}).value == "DYNAMIC"
    assert may_record_window({"fn": b"", "sources": {"<cell>": "with hvd_magic.timeline():"}})
    assert may_record_window({"fn": b"", "modules": {"m.py": "from hvd_magic import timeline"}})
    assert may_record_window({"fn": b"", "sources": {"<cell>": "hvd.start_timeline('t.json')"}})
    # Words are not names: a module whose docstring, comments or strings speak of timelines
    # (as the benchmarks' own do) keeps Horovod's timeline off.
    words = '"""Compare with a timeline."""\nX = "HOROVOD_TIMELINE"  # timeline off\n'
    assert not may_record_window({"fn": b"", "modules": {"m.py": words}})

    def speaks_of_it():
        """No timeline here."""
        return "the timeline is off"
    import cloudpickle
    assert not may_record_window({"fn": cloudpickle.dumps(speaks_of_it)})
    assert may_record_window({"fn": cloudpickle.dumps(window)})
