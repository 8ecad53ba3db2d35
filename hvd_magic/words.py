"""How counts are said to a person, the same in every view and message: "1 line", "2 lines".

Shared by the driver, the views, the launchers and the data room (which import nothing of each
other for it).
"""


def plural(n, word):
    """"1 line", "2 lines", "1,024 ranks"."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"
