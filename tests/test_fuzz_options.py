"""Bad input at volume (#67): every option of ``%%horovod`` and every keyword of
`hvd_magic.run`, fuzzed (hypothesis), gives a UsageError saying what to do, or a plan to run;
never a traceback from inside hvd_magic. Nothing is launched: the options are read and checked
as a cell's are, up to the launch."""

import math
import shlex

from hypothesis import HealthCheck, example, given, settings, strategies as st
from IPython.core.error import UsageError
from IPython.core.magic_arguments import parse_argstring

from hvd_magic import config
from hvd_magic.frontends import cells

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
VALUES = st.one_of(
    st.integers(-10 ** 6, 10 ** 6).map(str), st.floats(allow_nan=True).map(str),
    st.sampled_from(["", "0", "-1", "1e309", "nan", "inf", "-inf", "A=B", "=", "a:b", "3:2",
                     "2:2", "4:8", "1:60", "local[2]", "spark://nowhere:7077", "warn", "fail",
                     "x" * 300]),
    TEXT)


def _options(magic):
    """The option strings of a magic's parser (``--np``, ``--timeline``...)."""
    return sorted(s for action in magic.parser._actions for s in action.option_strings
                  if s.startswith("--") and s != "--help")


def _magics(ip):
    return next(m for m in ip.magics_manager.registry.values()
                if type(m).__name__ == "HorovodMagics")


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_options_of_a_cell_give_a_usage_error_or_a_plan(ip, data):
    magics = _magics(ip)
    options = _options(magics.horovod)
    pairs = data.draw(st.lists(st.tuples(st.sampled_from(options), st.one_of(st.none(), VALUES)),
                               max_size=5))
    line = " ".join(name if value is None else f"{name} {shlex.quote(value)}"
                    for name, value in pairs)
    try:
        args = parse_argstring(magics.horovod, line)
        cells.run_options(magics, args, cells.data_option(ip.user_ns, args.data))
    except UsageError as exc:
        assert str(exc).strip(), line  # a message, not an empty error


KEYWORDS = sorted((config._PLACEMENT | config._RUN) - {"np"})
ANY = st.one_of(st.none(), st.booleans(), st.integers(-10 ** 9, 10 ** 9),
                st.floats(allow_nan=True), TEXT, st.lists(st.integers(), max_size=3),
                st.dictionaries(TEXT, TEXT, max_size=2), st.just(object()))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(np=st.one_of(st.integers(-10 ** 6, 10 ** 6), st.floats(allow_nan=True), TEXT, st.none()),
       keywords=st.dictionaries(st.sampled_from(KEYWORDS), ANY, max_size=4))
@example(np=1, keywords={"timeline_detail": True})  # (a side-by-side fresh clone's TypeError)
@example(np=1, keywords={"timeline_detail": [3]})
def test_any_keywords_of_run_give_a_usage_error_or_a_plan(np, keywords):
    try:
        placement, options = config.split(np, **keywords)
    except UsageError as exc:
        assert str(exc).strip()
        return
    assert isinstance(placement.np, int) and placement.np != 0
    assert options.timeout is None or (options.timeout > 0 and math.isfinite(options.timeout))
