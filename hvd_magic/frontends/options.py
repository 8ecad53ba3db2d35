"""The magics' option values, parsed and checked: a `UsageError` that says what is expected."""

import re

from IPython.core.error import UsageError

# An elastic run's options, declared once for every front door that has them (``%%horovod``,
# ``%horovod train.py``, ``hvd-run``): the same names, defaults and help; `hvd_magic.config.Placement`
# checks their values, so each door refuses a bad combination with the same message.
ELASTIC_OPTIONS = (
    (("--min-np",), dict(
        type=int, default=None, metavar="M",
        help="An elastic run: a rank process or Spark executor that is lost is replaced "
             "and the others go on from their last commit, with code written for "
             "Horovod's elastic API (@hvd.elastic.run, hvd.elastic.TorchState, "
             "KerasState). On Spark each rank is a plain task, run again where Spark "
             "has room. The run ends if fewer than M ranks are left for longer than "
             "--elastic-timeout.")),
    (("--max-np",), dict(
        type=int, default=None, metavar="N",
        help="With --min-np: at most N ranks (default: the ranks of --np). On Spark, "
             "ranks beyond --np join when Spark has room for them.")),
    (("--elastic-timeout",), dict(
        type=float, default=None, metavar="S",
        help="With --min-np: seconds the run may have fewer than --min-np ranks "
             "(default 600, Horovod's).")),
    (("--restart-from-scratch",), dict(
        action="store_true",
        help="With --min-np: when every rank is lost at once, their state (the last commit) "
             "goes with them; with this the replacements start over from step 0, without it "
             "the run fails, naming what was lost.")),
    (("--frozen-timeout",), dict(
        type=float, default=None, metavar="S",
        help="With --min-np: a rank that is alive but frozen (its processes used no CPU, "
             "e.g. SIGSTOPped or deadlocked) while the others waited S seconds for it in a "
             "collective is declared lost: its processes are killed and the others go on "
             "(default 120).")),
)


# What ``--timeline`` records, declared here for the cell magic.
TIMELINE_OPTIONS = (
    (("--timeline",), dict(
        action="store_true",
        help="Record where the time goes: a Horovod timeline on rank 0 for a cell that uses "
             "Horovod; for one that uses torch without Horovod (DDP, FSDP, Lightning, "
             "accelerate, a plain loop), torch's profiler on every rank over a few optimizer "
             "steps, for TensorFlow (tf.distribute, Keras) TensorFlow's over a few Keras "
             "batches (or hvd_magic.report steps), for JAX JAX's over a few hvd_magic.report "
             "steps, merged with the clocks aligned. Brought back "
             "to the run folder (see %%horovod_timeline).")),
    (("--timeline-steps",), dict(
        type=str, default=None, metavar="A:B",
        help="With torch, TensorFlow or JAX: the steps the profiler records, from A to B (default "
             "4:8; implies --timeline).")),
    (("--timeline-detail",), dict(
        type=str, default=None, metavar="WHAT",
        help="With torch, TensorFlow or JAX: what the profiler records besides each operator's "
             "time, comma-separated: shapes, stacks, memory (torch; TensorFlow, JAX: stacks). Each "
             "costs step time. Implies --timeline.")),
)


def elastic_arguments(magic):
    """The magic's ``@argument`` lines for `ELASTIC_OPTIONS`, in their order."""
    return _arguments(magic, ELASTIC_OPTIONS)


def timeline_arguments(magic):
    """The magic's ``@argument`` lines for `TIMELINE_OPTIONS`, in their order."""
    return _arguments(magic, TIMELINE_OPTIONS)


def _arguments(magic, options):
    from IPython.core.magic_arguments import argument
    for flags, spec in reversed(options):  # (the lowest decorator is applied first)
        magic = argument(*flags, **spec)(magic)
    return magic


def elastic_kwargs(args):
    """The elastic fields of `hvd_magic.config.Placement` from parsed options."""
    return dict(min_np=args.min_np, max_np=args.max_np, elastic_timeout=args.elastic_timeout,
                restart_from_scratch=args.restart_from_scratch,
                frozen_timeout=args.frozen_timeout)


def names(text):
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise UsageError(f"--export takes comma-separated names, and {', '.join(bad)} is not a name.")
    return names


def env_option(items):
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise UsageError(f"--env takes NAME=VALUE, not {item!r}.")
        env[name] = value
    return env


def mlflow_before_script(tokens):
    """``--mlflow train.py args`` means: log to MLflow, and run train.py (argparse would read
    train.py as the experiment's name, then refuse the script's options)."""
    tokens = list(tokens)
    for i, token in enumerate(tokens[:-1]):
        if token == "--mlflow" and tokens[i + 1].endswith(".py"):
            tokens[i] = "--mlflow="
            break
        if token.endswith(".py") and not token.startswith("-"):
            break  # the script's own arguments start here
    return tokens


def summary_first(magic):
    """Open the magic's help (``%%horovod?``) with its first sentence and example, then the usage.

    IPython builds the help of a magic with options as usage line, docstring, options; a newcomer
    should read what the magic does and a cell to paste before the list of every option. The
    docstring's first paragraph is that sentence, its second the example (a ``::`` block).
    """
    _, _, rest = magic.__doc__.partition("::\n\n")  # (the reST markup of the usage block)
    usage, _, description = rest.partition("\n\n")
    lines = description.split("\n")
    # the end of the first "::" block: its indented lines and the blank lines among them
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith("::")) + 1
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace())
    head, tail = "\n".join(lines[:end]).rstrip(), "\n".join(lines[end:])
    magic.__doc__ = plain_text(f"{head}\n\nUsage::\n\n{usage}\n\n{tail}")
    return magic


def plain_text(doc):
    """A docstring written in reST as a person reads it in ``%%horovod?`` (IPython shows it as
    it is): no ``::`` before a code block (alone on its line, the line goes; after a sentence,
    a colon stays), no double backquotes around code."""
    text = re.sub(r"^[ \t]*::\n\n", "", doc, flags=re.M)  # a "::" line and the blank after it
    text = re.sub(r"::$", ":", text, flags=re.M)
    return re.sub(r"``(.+?)``", r"\1", text, flags=re.S)
