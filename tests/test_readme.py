"""README.md and the pages under docs/: the README's first lines are the two commands, the
options page is what the magics' own help says (scripts/readme_options.py writes it; here it must
already be up to date), and every link of every page leads somewhere: a file that exists, a
heading that exists."""

import os
import re
import subprocess
import sys

from conftest import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "readme_options.py")
README = os.path.join(ROOT, "README.md")
OPTIONS = os.path.join(ROOT, "docs", "options.md")
PAGES = [README] + sorted(os.path.join(ROOT, "docs", name)
                          for name in os.listdir(os.path.join(ROOT, "docs")) if name.endswith(".md"))


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


def test_the_options_page_is_the_magics_help():
    result = check(OPTIONS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_stale_options_section_is_caught(tmp_path):
    with open(OPTIONS) as f:
        text = f.read()
    assert "--stall-timeout" in text and "--summary" in text  # generated from each magic's help
    stale = tmp_path / "options.md"
    stale.write_text(text.replace("Stop every rank after this many seconds.", "Old help."))
    result = check(stale)
    assert result.returncode == 1
    assert "-  --timeout TIMEOUT     Old help." in result.stdout
    assert re.search(r"\+  --timeout TIMEOUT +Stop every rank", result.stdout)


def headings(path):
    """The anchors of a Markdown file's headings, as GitHub makes them (code fences skipped)."""
    anchors, fence = set(), False
    with open(path) as f:
        for line in f:
            if line.startswith("```"):
                fence = not fence
            elif not fence and line.startswith("#"):
                text = line.lstrip("#").strip().lower().replace("`", "")
                anchors.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return anchors


def links(path):
    """(target, line number) of every Markdown link outside code fences."""
    found, fence = [], False
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                fence = not fence
            elif not fence:
                found += [(m.group(1), number) for m in re.finditer(r"\]\(([^)\s]+)\)", line)]
    return found


def test_every_link_of_the_readme_and_the_docs_leads_somewhere():
    broken = []
    for page in PAGES:
        for target, number in links(page):
            if re.match(r"[a-z]+:", target):
                continue  # the web: not checked here
            path, _, anchor = target.partition("#")
            where = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(where):
                broken.append(f"{os.path.relpath(page, ROOT)}:{number}: no {path}")
            elif anchor and where.endswith(".md") and anchor not in headings(where):
                broken.append(f"{os.path.relpath(page, ROOT)}:{number}: no heading #{anchor}")
    assert broken == []


def test_the_readme_is_a_front_door_with_a_map():
    with open(README) as f:
        text = f.read()
    assert len(text.split()) < 1500  # the reference is on the pages, not on the front page
    mapped = {target.partition("#")[0] for target, _ in links(README)}
    pages = {os.path.relpath(p, ROOT) for p in PAGES[1:]}
    assert pages - mapped == set()  # every page is linked from the map
