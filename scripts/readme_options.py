"""Write the options of hvd_magic's magics into docs/options.md, from the magics' own help.

The page's section between the BEGIN and END markers below is generated: for each magic, the
text that ``%%horovod?`` (``%horovod_timeline?``, ``%horovod_env?``) prints, which IPython builds
from the docstring and the ``help=`` strings of its options. So the page cannot drift from the
code: change an option, run this script; tests/test_readme.py fails until then.

    python scripts/readme_options.py           # rewrite the section of docs/options.md
    python scripts/readme_options.py --check   # exit 1 (and show a diff) if it is out of date
"""

import argparse
import difflib
import inspect
import os
import sys

# argparse wraps help text to the terminal's width: fix it, so every machine writes the same text.
# (Read when the magics are imported, below.)
os.environ["COLUMNS"] = "80"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BEGIN = ("<!-- BEGIN magic options: generated from the magics' help by "
         "scripts/readme_options.py; do not edit by hand -->")
END = "<!-- END magic options -->"
MAGICS = [("%%horovod", "horovod"), ("%horovod_timeline", "horovod_timeline"),
          ("%horovod_env", "horovod_env"), ("%horovod_session", "horovod_session"),
          ("%horovod_tensorboard", "horovod_tensorboard"), ("%horovod_data", "horovod_data"),
          ("%horovod_stacks", "horovod_stacks"), ("%horovod_debug", "horovod_debug")]


def magic_help(method_name):
    """What IPython shows for ``%name?``: the docstring, with usage and options when it has them."""
    sys.path.insert(0, ROOT)
    from hvd_magic.frontends.magics import HorovodMagics
    text = inspect.cleandoc(getattr(HorovodMagics, method_name).__doc__)
    return text.removeprefix("::\n\n")  # (reST markup before the usage line)


def section():
    parts = [BEGIN]
    for shown, method_name in MAGICS:
        parts += ["", f"## `{shown}`", "", "```text", magic_help(method_name), "```"]
    parts += ["", END]
    return "\n".join(parts)


def rewrite(readme_text):
    """The page with its generated section replaced by the current one."""
    start, end = readme_text.find(BEGIN), readme_text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"docs/options.md has no section between\n  {BEGIN}\nand\n  {END}")
    return readme_text[:start] + section() + readme_text[end + len(END):]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if the page's section is out of date")
    parser.add_argument("--readme", default=os.path.join(ROOT, "docs", "options.md"),
                        help="the page to write (default docs/options.md)")
    args = parser.parse_args(argv)
    with open(args.readme) as f:
        current = f.read()
    wanted = rewrite(current)
    if current == wanted:
        return 0
    if args.check:
        sys.stdout.writelines(difflib.unified_diff(
            current.splitlines(True), wanted.splitlines(True), "docs/options.md", "generated"))
        print(f"\n{args.readme} is out of date: run  python scripts/readme_options.py")
        return 1
    with open(args.readme, "w") as f:
        f.write(wanted)
    print(f"rewrote the magic options in {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
