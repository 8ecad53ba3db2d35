"""The magics' option values, parsed and checked: a `UsageError` that says what is expected."""

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
