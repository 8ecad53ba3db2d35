"""What `make test` can try of the support matrix (docs/install.md) in seconds: every module of
the package compiles under each Python we support that this machine has (pyenv's 3.10 to 3.13),
and pyproject.toml claims what the matrix tries. `make matrix` runs the suite's slice there."""

import ast
import glob
import os
import re
import subprocess

import pytest

from conftest import ROOT

SUPPORTED = ("3.10", "3.11", "3.12", "3.13")
COMPILE_ALL = """\
import sys
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        compile(f.read(), path, "exec")   # (no .pyc written: a SyntaxError is the answer)
"""


def interpreters():
    root = os.path.expanduser(os.environ.get("PYENV_ROOT", "~/.pyenv"))
    found = {}
    for python in sorted(glob.glob(os.path.join(root, "versions", "3.*", "bin", "python"))):
        version = ".".join(python.split(os.sep)[-3].split(".")[:2])
        if version in SUPPORTED:
            found[version] = python
    return found


@pytest.mark.parametrize("version", SUPPORTED)
def test_every_module_compiles_on_each_supported_python(version):
    python = interpreters().get(version)
    if python is None:
        pytest.skip(f"no Python {version} here (pyenv install {version})")
    files = glob.glob(os.path.join(ROOT, "hvd_magic", "**", "*.py"), recursive=True)
    out = subprocess.run([python, "-c", COMPILE_ALL, *files], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_pyproject_claims_the_pythons_the_matrix_tries():
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    assert re.search(r'requires-python = ">=3\.10"', text)
    claimed = set(re.findall(r"Programming Language :: Python :: (3\.\d+)\"", text))
    assert claimed == set(SUPPORTED)
    with open(os.path.join(ROOT, "scripts", "matrix.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    tried = {node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "Combo"}
    assert tried | {"3.11"} == set(SUPPORTED)  # (3.11: make test's own Python)
