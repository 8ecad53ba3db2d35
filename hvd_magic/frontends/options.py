"""The magics' option values, parsed and checked: a `UsageError` that says what is expected."""

import re

from IPython.core.error import UsageError


def names(text):
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise UsageError(f"--export takes comma-separated names, and {', '.join(bad)} is not a name.")
    return names


def positive(flag, value):
    """None for "no limit" (0 or unset); a positive number; else a UsageError."""
    if not value:
        return None
    if value < 0:
        raise UsageError(f"{flag} takes a positive number of seconds, not {value:g}.")
    return value


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
