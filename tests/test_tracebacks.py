"""A failing rank's traceback names the cell and line as IPython names a plain cell's, in a real
kernel (jupyter_client, as a notebook front end sends cells): ``Cell In[N], line L``, N the
prompt number the front end shows for that cell and L the line as the editor numbers it (the
``%%horovod`` line is line 1); in a one-off run and in a warm session's cell alike."""

import re

import pytest

from test_live_view import Kernel


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    k = Kernel(tmp_path_factory.mktemp("tracebacks"))
    yield k
    k.close()


def failure(kernel, code):
    """(the prompt number of the cell, the text of the error it showed)."""
    reply, messages = kernel.execute(code)
    assert reply["content"]["status"] == "error", reply["content"]
    tb = next(m for m in messages if m["msg_type"] == "error")["content"]["traceback"]
    return reply["content"]["execution_count"], re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(tb))


def test_plain_python_cell_for_comparison(kernel):
    n, text = failure(kernel, "x = 1\n\n1 / 0\n")
    assert f"Cell In[{n}], line 3" in text


def test_a_one_off_cells_traceback_names_its_prompt_and_the_editors_line(kernel):
    kernel.execute("1 + 1")  # prompt numbers and IPython's own count differ by then, if at all
    n, text = failure(kernel, "%%horovod --np -2 --text\n"
                              "import os\n"
                              "\n"
                              "def check(rank):\n"
                              "    if rank == '1':\n"
                              "        raise ValueError('bad rank')\n"
                              "\n"
                              "check(os.environ['HOROVOD_RANK'])\n")
    assert "ValueError: bad rank" in text
    assert f"Cell In[{n}], line 8" in text, text          # the call, in the cell itself
    assert f"Cell In[{n}], line 6, in check" in text, text  # the raise, in its function
    assert "<hvd_magic cell" not in text


def test_what_a_cell_defines_is_named_as_the_user_named_it(kernel):
    # a cell's code runs as the body of a function: its classes and functions are not named
    # after it (``hvd_magic_cell.__cell__.<locals>.ShapeError``), as in a plain cell
    n, text = failure(kernel, "%%horovod --np -2 --text\n"
                              "import os\n"
                              "class ShapeError(Exception):\n"
                              "    pass\n"
                              "def check(rank, width):\n"
                              "    if rank == '1':\n"
                              "        raise ShapeError(f'width {width}')\n"
                              "check(os.environ['HOROVOD_RANK'])\n")
    assert "TypeError: check() missing 1 required positional argument: 'width'" in text, text
    assert f"Cell In[{n}], line 8" in text, text
    assert "__cell__" not in text and "hvd_magic_cell" not in text, text
    n, text = failure(kernel, "%%horovod --np -2 --text\n"
                              "import os\n"
                              "class ShapeError(Exception):\n"
                              "    pass\n"
                              "if os.environ['HOROVOD_RANK'] == '1':\n"
                              "    raise ShapeError('width 4')\n")
    assert "\nShapeError: width 4" in text and "failed: ShapeError: width 4" in text, text
    assert "__cell__" not in text and "hvd_magic_cell" not in text, text


def test_a_syntax_error_names_the_prompt_and_the_editors_line(kernel):
    n, text = failure(kernel, "%%horovod --np -2\nx = 1\ny = (2 +\n")
    assert f"Cell In[{n}], line 3" in text, text
    assert "SyntaxError" in text


def test_a_warm_session_cells_traceback_names_its_prompt_and_the_editors_line(kernel):
    reply, _ = kernel.execute("%horovod_session start --np -2")
    assert reply["content"]["status"] == "ok", reply["content"]
    try:
        kernel.execute("%%horovod --text\ny = 2\n")
        n, text = failure(kernel, "%%horovod --text\n"
                                  "z = y * 3\n"
                                  "{}['missing']\n")
        assert "KeyError: 'missing'" in text
        assert f"Cell In[{n}], line 3" in text, text
        assert "<hvd_magic cell" not in text
    finally:
        kernel.execute("%horovod_session stop")


def test_a_ranks_last_words_are_not_headed_as_a_traceback():
    """A rank killed by a signal has its log's last lines, which are no traceback: the header
    said "--- traceback of rank 1 ---" over them."""
    from hvd_magic.errors import RankError

    killed = RankError({"rank": 1, "host": "h", "status": "died", "signal": "SIGKILL",
                        "traceback": "last lines of rank 1's log:\nepoch 3: loss 0.25"})
    text = "\n".join(killed._render_traceback_())
    assert "--- rank 1 (h) ---\nlast lines of rank 1's log:" in text and "traceback of" not in text
    raised = RankError({"rank": 1, "host": "h", "status": "error", "type": "ValueError",
                        "message": "x", "traceback": 'Traceback (most recent call last):\n'
                                                     '  File "t.py", line 1, in <module>\n'
                                                     'ValueError: x'})
    assert "--- traceback of rank 1 (h) ---" in "\n".join(raised._render_traceback_())
