"""The other way of starting ranks: each rank a new interpreter (``--fresh``,
``HVD_MAGIC_FRESH=1``), where the rest of the suite forks them from the host's template
(`hvd_magic.template`, the default). The tests below are the suite's own, imported from their
modules and collected here a second time with fresh ranks: cells on Spark and on the driver, a
rank's error and death, the first error stopping the others, a timeout, an elastic run's error,
a warm session and a killed notebook's ranks, a script, DDP, ``--data``."""

import json

import pytest

from test_data import spark, table_dir  # noqa: F401  (their fixtures)
from test_data import test_a_parquet_scan_is_read_directly_in_equal_seeded_resumable_batches  # noqa: F401
from test_ddp import test_ddp_averages_the_ranks_gradients  # noqa: F401
from test_elastic import test_an_error_in_the_cell_fails_an_elastic_run_with_its_traceback  # noqa: F401
from test_failures import (test_a_rank_that_dies_is_named_with_its_cause,  # noqa: F401
                           test_first_real_error_stops_the_others_fast,
                           test_timeout_stops_every_rank_and_says_what_they_were_doing)
from test_foundation import (test_allreduce_cell_on_embedded_spark,  # noqa: F401
                             test_error_on_one_rank_shows_that_ranks_traceback)
from test_scripts import script_folder  # noqa: F401  (its fixture)
from test_scripts import test_a_failing_rank_shows_the_scripts_own_traceback_and_exit_code  # noqa: F401
from test_sessions import session  # noqa: F401  (its fixture)
from test_sessions import (test_state_lives_across_cells_and_the_ranks_own_names_win,  # noqa: F401
                           test_the_ranks_of_a_killed_notebook_exit)


@pytest.fixture(autouse=True)
def _fresh_ranks(monkeypatch, tmp_path):
    """Every run of these tests (the magic's, the API's, a notebook's subprocess) starts fresh
    ranks; and a check that they did, after each test. Each rank says with its first state
    whether it is an interpreter of its own (`hvd_magic.rank.reporting.fresh`), and each run
    keeps its events in its folder, in the test's folder wherever the run's notebook was."""
    monkeypatch.setenv("HVD_MAGIC_FRESH", "1")
    yield
    said = {}  # (run, rank) -> whether the rank said it was a new interpreter
    for path in tmp_path.rglob("events.jsonl"):
        for event in map(json.loads, open(path)):
            if event.get("t") == "state" and event.get("state") == "running":
                key = (path.parent.name, event["rank"])
                said.setdefault(key, None)
                if "fresh" in event:  # (in a session's cell, said by the session for the rank)
                    said[key] = event["fresh"]
    assert said, f"no run of this test said how its ranks started, in {tmp_path}"
    assert all(fresh is True for fresh in said.values()), said
