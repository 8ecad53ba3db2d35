"""How counts and sizes are said to a person, the same in every view and message: "1 line",
"2 lines", "1.2 GB".

Shared by the driver, the views, the launchers and the data room (which import nothing of each
other for it).
"""


def plural(n, word):
    """"1 line", "2 lines", "1,024 ranks"."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def size(nbytes):
    """"1.2 GB", "350 MB": memory as a person reads it."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.3g} {unit}"
    return f"{nbytes} B"
