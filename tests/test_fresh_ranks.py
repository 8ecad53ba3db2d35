"""The other way of starting ranks: each rank a new interpreter (``--fresh``,
``HVD_MAGIC_FRESH=1``), where the rest of the suite forks them from the host's template
(`hvd_magic.template`, the default). The tests below are the suite's own, imported from their
modules and collected here a second time with fresh ranks: cells on Spark and on the driver, a
rank's error and death, the first error stopping the others, a timeout, an elastic run's error,
a warm session and a killed notebook's ranks, a script, DDP, ``--data``."""

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
def _fresh_ranks(monkeypatch):
    """Every run of these tests (the magic's, the API's, a notebook's subprocess) starts fresh
    ranks; and a check that they did, after each test."""
    monkeypatch.setenv("HVD_MAGIC_FRESH", "1")
    import hvd_magic
    before = hvd_magic.last_run()
    yield
    run = hvd_magic.last_run()
    if run is not None and run is not before:
        assert run.options.fresh, "this test's last run forked its ranks"
