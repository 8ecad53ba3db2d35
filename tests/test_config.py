"""Options are parsed and checked once (`hvd_magic.config`): every front door refuses the same
mistake with the same message, before anything starts (no Spark, no rank)."""

import pytest
from IPython.core.error import UsageError

import hvd_magic
from hvd_magic.frontends import terminal
from hvd_magic.frontends.horovod_runner import HorovodRunner
from hvd_magic.frontends.script import run_script
from hvd_magic.config import Placement, RunOptions, check_together, split


def one():
    return 1


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('never run')\n")
    return str(path)


# (option as the magic's line says it, the same as keyword arguments, what the message says)
MISTAKES = [
    ("--timeout -5", {"timeout": -5}, "--timeout takes a positive number of seconds"),
    ("--stall-timeout -1", {"stall_timeout": -1}, "--stall-timeout takes a positive number"),
    ("--retries -1", {"retries": -1}, "retries must be a whole number >= 0"),
    ("--min-np 3", {"min_np": 3}, "min_np <= ranks <= max_np; got min_np 3, 2 ranks"),
    ("--max-np 4", {"max_np": 4}, "--elastic-timeout and --frozen-timeout belong to an elastic"),
    ("--restart-from-scratch", {"restart_from_scratch": True},
     "so does --restart-from-scratch"),
    ("--frozen-timeout 30", {"frozen_timeout": 30}, "--frozen-timeout belong to an elastic run"),
    ("--min-np 1 --elastic-timeout -2", {"min_np": 1, "elastic_timeout": -2},
     "elastic_timeout takes a positive number of seconds"),
    ("--min-np 1 --frozen-timeout 0", {"min_np": 1, "frozen_timeout": 0},
     "frozen_timeout takes a positive number of seconds"),
]


@pytest.mark.parametrize("line, keywords, message", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_every_front_door_refuses_a_mistake_the_same_way(ip, fresh_ns, script, capsys, line,
                                                         keywords, message):
    runs_before = len(hvd_magic.runs())
    with pytest.raises(UsageError, match=message):
        ip.run_cell_magic("horovod", f"--np -2 --text {line}", "1")
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("horovod", f"--np -2 --text {line} {script}")
    with pytest.raises(UsageError, match=message):
        hvd_magic.run(one, np=-2, **keywords)
    with pytest.raises(UsageError, match=message):
        run_script(script, np=-2, **keywords)
    if not {"min_np", "max_np", "restart_from_scratch", "frozen_timeout"} & set(keywords):
        # (HorovodRunner: no elastic)
        with pytest.raises(UsageError, match=message):
            HorovodRunner(np=-2, text=True, **keywords).run(one)
    capsys.readouterr()
    assert terminal.main(["--np", "-2", *line.split(), script]) == terminal.EXIT_USAGE
    assert message.split(";")[0] in capsys.readouterr().err
    assert len(hvd_magic.runs()) == runs_before  # refused before any run began


def test_a_session_refuses_bad_placement_before_starting(ip, capsys):
    with pytest.raises(UsageError, match="min_np <= ranks <= max_np"):
        ip.run_line_magic("horovod_session", "start --np -2 --min-np 3")
    assert "starting a warm session" not in capsys.readouterr().out


def test_placement_fields():
    assert Placement(-3).rows == 3 and Placement(-3).on_driver and Placement(-3).elastic is None
    elastic = Placement(2, min_np=1, max_np=4)
    assert elastic.elastic == (1, 4, None) and elastic.rows == 4   # a row per slot on Spark
    assert Placement(-2, min_np=1).elastic == (1, 2, None) and Placement(-2, min_np=1).rows == 2
    for np in (0, True, 1.5, "2"):
        with pytest.raises(UsageError, match="np must be a non-zero whole number"):
            Placement(np)


def test_run_options_fields():
    options = RunOptions(timeout=0, stall_timeout=0, tensorboard="tb", env=None)
    assert options.timeout is None and options.stall_timeout is None  # 0: no limit
    assert options.tensorboard.endswith("tb") and options.tensorboard.startswith("/")
    assert options.env == {}
    with pytest.raises(UsageError, match="--on-stall takes warn or fail, not 'stop'"):
        RunOptions(on_stall="stop")
    with pytest.raises(UsageError, match="--equal-shards evens the shards of --data"):
        RunOptions(equal_shards=True)
    with pytest.raises(UsageError, match="takes a Spark DataFrame, not a dict"):
        RunOptions(data={})


def test_split_refuses_unknown_keywords_and_checks_together():
    with pytest.raises(TypeError, match="unexpected keyword argument.*tiemout"):
        split(2, tiemout=3)
    placement, options = split(-2, run_root="elsewhere", timeout=5, verbose=True)
    assert placement.log_dir == "elsewhere" and placement.verbose and options.timeout == 5
    frame = type("DataFrame", (), {"__module__": "pyspark.sql.dataframe"})()
    with pytest.raises(UsageError, match="not available in elastic runs"):
        check_together(Placement(2, min_np=1), RunOptions(data=frame))
    assert check_together(Placement(2), RunOptions(data=frame))[1].data is frame


def test_the_api_keeps_its_signature():
    import inspect
    parameters = inspect.signature(hvd_magic.run).parameters
    assert {"timeout", "min_np", "data", "mlflow", "stall_timeout", "view"} <= set(parameters)


def test_hvd_run_called_in_a_program_leaves_its_spark_session_alone(script):
    """`terminal.main` ends the Spark session a run of its own started, never the caller's (a
    stopped one would also stay remembered and refuse every later SparkSession.builder)."""
    from conftest import spark_session
    from pyspark import SparkContext

    spark = spark_session(2)
    assert terminal.main(["--np", "-2", "--timeout", "-1", script]) == terminal.EXIT_USAGE
    assert SparkContext._active_spark_context is spark.sparkContext
    assert spark.range(3).count() == 3
