r"""What a rank's printed lines show as to a person: what a terminal would have left of them.

A rank's output is written for a terminal: progress bars redrawn with ``\r`` (tqdm's, Lightning's),
a second bar reached with cursor moves (tqdm's nested bars, Lightning's validation bar), colours,
a hidden and shown cursor and erased lines (rich's, which a Jupyter kernel's ``FORCE_COLOR``
turns on in the ranks). The run folder keeps every byte as it came; the views show the text:

- `visible_text`: a line's last redraw, escape codes dropped (the last-line column, the text view);
- `screen`: a log's tail as the rows a terminal would show (a log panel);
- `last_said`: a rank's last line: warnings and library adverts only when nothing else was said;
- `is_chatter`: the C++ libraries' start-up lines, kept in the raw log, shown with --verbose;
- `printed`: the lines as a person reads them (the text view's, a rank's readable log).

Shared by the driver (the last line its messages quote, the readable logs) and the views; it
imports nothing of either. Not for: which lines are stack dumps (`hvd_magic.view`).
"""

import re

# ECMA-48 escapes: a control sequence (ESC [ ... final byte: colours, cursor moves, erasing), an
# operating system command (ESC ] ... BEL or ESC \: a window title, a hyperlink), or ESC and one
# byte (a charset, a saved cursor).
_ESCAPE = r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])"
_ESCAPES = re.compile(_ESCAPE)
_CONTROLS = re.compile(f"(\r|{_ESCAPE})")
_MOVE = re.compile(r"\x1b\[(\d*)([ABK])")
# A line that ends by moving the cursor up: the next line is written over it (tqdm's nested bar).
_ENDS_UP = re.compile(r"\x1b\[\d*A[\r\s]*$")

# Python's warnings (``file.py:21: DeprecationWarning: ...``, ``Cell In[1], line 4: ...``;
# Lightning's own format leaves the category out: ``_pytree.py:21: `isinstance(...)` is
# deprecated``), a bare ``UserWarning: ...``, and libraries' adverts (Lightning's "💡 Tip: ..."):
# a rank's last line only if nothing else is.
_WARNING = re.compile(r"(?:\S.*?\.py|<[^>]+>):\d+: |\S.*?:\d+: \w*Warning: |\w*Warning: "
                      r"|Cell In\[\d+\], line \d+: \w*Warning: ")
_ADVERT = re.compile(r"\s*💡")


# The INFO lines of C++ libraries on the ranks (TensorFlow's oneDNN and cudart notes, XLA, Horovod's
# own log) in the formats of absl/glog ("I0501 10:00:00.123 123 file.cc:12]"), TensorFlow
# ("2024-05-01 10:00:00.123: I file.cc:12]") and Horovod ("[2024-05-01 10:00:00.123: I file.cc:12]").
_CXX_INFO = re.compile(
    r"\s*(?:[ID]\d{4} [\d:.]+\s+\d+ \S+:\d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [ID] \S+:\d+\]"
    r"|\[(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: )?[TDI] \S+:\d+\])")
_CXX_FIRST = "ID[0123456789 \t"  # (what such a line starts with: the others are not matched)
# torch's profiler (Kineto) says when it starts and stops, whatever KINETO_LOG_LEVEL says:
# "USDT:2026-11-29 22:56:12 123:123 SyncActivityProfilerHandler.cpp:59] profiler_stop"
# A CUDA build of torch on a machine without a GPU (pip's torch, on a CPU host) adds, as the
# profiler starts, "ERROR:<time> <pid>:<tid> DeviceProperties.cpp:56] gpuGetDeviceCount failed
# with code 35": its probe for the GPUs that are not there; the CPU trace is whole.
_KINETO = re.compile(r"(?:USDT|STAGE):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\]"
                     r"|ERROR:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+:\d+\] "
                     r"gpuGetDeviceCount failed")
# Gloo's own notes on stdout as its full mesh connects (JAX's CPU collectives print them on every
# rank, after the cell's own lines): "[Gloo] Rank 1 is connected to 1 peer ranks. Expected
# number of connected peer ranks is : 1"
_GLOO = re.compile(r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks")
# What TensorFlow's C++ side says at start-up in other forms: absl's note before its logging is
# set up (printed whatever TF_CPP_MIN_LOG_LEVEL says), the oneDNN and CPU-instruction notes;
# searched for only in a line that names absl, oneDNN or TensorFlow (every line of a log is asked).
_STARTUP = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|oneDNN custom operations are on"
    r"|This TensorFlow binary is optimized to use available CPU instructions"
    r"|rebuild TensorFlow with the appropriate compiler flags")


def plain(text):
    """`text` with its escape codes dropped."""
    return _ESCAPES.sub("", text) if "\x1b" in text else text


def visible_text(line):
    r"""What a terminal shows of a line: the text after its last carriage return, escape codes
    dropped. A progress bar redrawn with ``\r`` shows as its last state; a trailing ``\r`` (a
    ``\r\n`` line end) is not a redraw."""
    if "\r" in line:
        line = line.rstrip("\r").rsplit("\r", 1)[-1]
    return plain(line)


def is_chatter(line):
    """True for the C++ libraries' start-up chatter: INFO lines and TensorFlow's start-up notes.
    Kept in the rank's raw log; shown only with --verbose."""
    return bool(line[:1] in _CXX_FIRST and _CXX_INFO.match(line)
                or line[:1] in "USE" and _KINETO.match(line)
                or line[:1] == "[" and _GLOO.match(line)
                or ("absl" in line or "oneDNN" in line or "TensorFlow" in line)
                and _STARTUP.search(line))


def printed(lines, verbose=False):
    """The lines as a person reads them: each one's last redraw, escape codes dropped (a
    terminal's cursor is not ours to move, nor a notebook's to draw); not a line the rank wrote
    over (a nested bar's), one that was only escape codes (rich's cursor shown), or start-up
    chatter unless verbose. What the text view prints, and a rank's readable log."""
    for line in lines:
        if not verbose and is_chatter(line):
            continue
        if "\x1b" not in line and "\r" not in line:  # (most lines: nothing to work out)
            yield line
        elif not is_redrawn(line):
            shown = visible_text(line)
            if shown or line.isspace():
                yield shown


def is_redrawn(line):
    """True for a line the terminal writes the next one over: it ends moving the cursor up."""
    return "\x1b" in line and bool(_ENDS_UP.search(line))


def is_warning(text):
    """True for the first line of a Python warning, as `warnings` (or Lightning) prints it."""
    return bool(_WARNING.match(text))


def is_aside(text):
    """True for a warning's first line, a library's advert, or a rule (a line of dashes or of a
    drawn table's borders, no letter or digit: Lightning's banner): not what a rank has to say."""
    return bool(_WARNING.match(text) or _ADVERT.match(text)
                or not any(c.isalnum() for c in text))


def last_said(newest_first, skip=None):
    """(text, aside) of a rank's last line, from its raw lines newest first: the newest that shows
    something (`visible_text`) and that `skip(raw, text)` does not refuse. A warning, the source
    line Python prints indented under it, or an advert is taken (``aside`` True) only when no
    other line is left. Lines are looked at from the end only as far as it takes (the driver
    sees ~100,000 lines a second at np 1024): usually one. ("", False) when none shows."""
    aside = None
    indented = None  # an indented line: a warning's source line if the line above is the warning
    for raw in newest_first:
        text = visible_text(raw)
        if not text.strip() or (skip is not None and skip(raw, text)):
            continue
        if indented is not None:
            if not is_warning(text):
                return indented, False
            aside, indented = aside or text, None
            continue
        if is_aside(text):
            aside = aside or text
        elif text[:1].isspace():
            indented = text
        else:
            return text, False
    if indented is not None:
        return indented, False
    return (aside, True) if aside is not None else ("", False)


def screen(lines):
    r"""The rows a terminal would show after `lines` (raw, oldest first, each ended by a newline):
    text after a ``\r`` replaces its row (a bar's redraw), a cursor moved up makes the next text
    replace an earlier row (tqdm's nested bars, rich's live display), an erased line is empty,
    and other escape codes (colours, the cursor hidden) are dropped. A cursor moved above the
    first line stays on it: what came before is not known here."""
    rows = []
    row = 0
    for line in lines:
        if row == len(rows) and "\r" not in line and "\x1b" not in line:
            rows.append(line)  # the usual line: nothing to work out
            row += 1
            continue
        replace = True  # a line starts at the row's first column: its text replaces the row
        for part in _CONTROLS.split(line):
            if not part:
                continue
            while row >= len(rows):
                rows.append("")
            if part == "\r":
                replace = True
            elif part[0] != "\x1b":
                rows[row] = part if replace else rows[row] + part
                replace = False
            else:
                move = _MOVE.fullmatch(part)
                if move is None:
                    continue  # colours, the cursor shown or hidden: nothing on the screen
                count, kind = int(move.group(1) or 1), move.group(2)
                if kind == "A":
                    row = max(0, row - count)
                elif kind == "B":
                    row += count
                elif replace or move.group(1) == "2":  # erased from the first column: all of it
                    rows[row] = ""
        row += 1
    return rows
