"""README.md: its first lines are the two commands, and its options section is what the magics'
own help says (scripts/readme_options.py writes it; here it must already be up to date)."""

import os
import re
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "readme_options.py")
README = os.path.join(ROOT, "README.md")


def check(readme):
    return subprocess.run([sys.executable, SCRIPT, "--check", "--readme", str(readme)],
                          capture_output=True, text=True)


def test_readme_starts_with_the_two_commands():
    with open(README) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("# ")
    fence = lines.index("```")
    assert fence <= 2
    closing = lines.index("```", fence + 1)
    commands = [line.split("#")[0].strip() for line in lines[fence + 1:closing]]
    assert commands == ["make demo", "make test"]


def test_readme_options_are_the_magics_help():
    result = check(README)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_stale_options_section_is_caught(tmp_path):
    with open(README) as f:
        text = f.read()
    assert "--stall-timeout" in text and "--summary" in text  # generated from each magic's help
    stale = tmp_path / "README.md"
    stale.write_text(text.replace("Stop every rank after this many seconds.", "Old help."))
    result = check(stale)
    assert result.returncode == 1
    assert "-  --timeout TIMEOUT     Old help." in result.stdout
    assert re.search(r"\+  --timeout TIMEOUT +Stop every rank", result.stdout)
