"""binder/ (what mybinder.org builds the notebooks' image from) stays in step with the project.

binder/requirements.txt is a second list of packages, so it is checked against the first:
pyproject.toml's dependencies and its spark and torch extras with the same specifiers, torch
pinned as scripts/setup.sh pins it, plus every package the notebooks import, with the specifier the test extras give it.
"""

import ast
import os
import re
import sys

import nbformat
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from conftest import ROOT

BINDER = os.path.join(ROOT, "binder")
# Imported by the notebooks, installed another way on binder: the project itself, Horovod, and
# TensorFlow with Keras (scripts/install_tensorflow.sh: tf-keras needs --no-deps, which a
# requirements file cannot say), all by binder/postBuild.
INSTALLED_BY_POSTBUILD = {"hvd_magic", "horovod", "tensorflow", "keras", "tf_keras"}


def pyproject():
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def by_name(lines):
    reqs = [Requirement(line) for line in lines]
    return {canonicalize_name(r.name): r for r in reqs}


def binder_requirements():
    with open(os.path.join(BINDER, "requirements.txt")) as f:
        lines = [line.split("#", 1)[0].strip() for line in f]
    return by_name(line for line in lines if line and not line.startswith("-"))


def setup_torch_version():
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        return re.search(r"^torch_version=(\S+)$", f.read(), re.M).group(1)


def notebook_imports():
    """Top-level modules imported by the notebooks' code (magic and shell lines left out)."""
    names = set()
    for name in os.listdir(os.path.join(ROOT, "notebooks")):
        if not name.endswith(".ipynb"):
            continue
        nb = nbformat.read(os.path.join(ROOT, "notebooks", name), as_version=4)
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            source = "\n".join(line for line in cell.source.splitlines()
                               if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names.add(node.module.split(".")[0])
    return names


def sandbox_requirements():
    """What binder's image, like `make setup`'s sandbox, installs of the project: its
    dependencies and the extras that run its notebooks (Spark, torch: Horovod is built there)."""
    extras = pyproject()["optional-dependencies"]
    return by_name([*pyproject()["dependencies"], *extras["spark"], *extras["torch"]])


def test_binder_lists_the_project_dependencies_with_the_same_specifiers():
    binder = binder_requirements()
    torch_version = setup_torch_version()
    for req in sandbox_requirements().values():
        name = canonicalize_name(req.name)
        assert name in binder, f"binder/requirements.txt lacks {req}"
        if name == "torch":
            assert binder[name].specifier == SpecifierSet(f"=={torch_version}"), \
                "binder's torch must be the version scripts/setup.sh installs"
            assert torch_version in req.specifier
        else:
            assert binder[name].specifier == req.specifier, \
                f"binder has {binder[name]}, pyproject.toml has {req}"


def test_binder_installs_what_the_notebooks_import():
    from importlib.metadata import packages_distributions
    binder = binder_requirements()
    dependencies = sandbox_requirements()
    extras = by_name(pyproject()["optional-dependencies"]["test"])
    distributions = packages_distributions()
    needed = set()
    for module in notebook_imports() - INSTALLED_BY_POSTBUILD:
        if module in sys.stdlib_module_names:
            continue
        assert module in distributions, f"the notebooks import {module}, which is not installed"
        needed.update(canonicalize_name(d) for d in distributions[module])
    assert {"torch", "matplotlib", "scikit-learn"} <= needed  # the check sees real imports
    for name in needed:
        assert name in binder, f"the notebooks import {name}; add it to binder/requirements.txt"
        if name not in dependencies:
            assert name in extras, f"add {name} to the test extras too (the tests run the notebooks)"
            assert binder[name].specifier == extras[name].specifier
    # Nothing else: every package binder installs is a dependency or imported by a notebook.
    assert set(binder) <= set(dependencies) | needed


def test_binder_files():
    with open(os.path.join(BINDER, "apt.txt")) as f:
        packages = f.read().split()
    assert "openjdk-17-jre-headless" in packages  # pyspark 4 needs Java 17
    with open(os.path.join(BINDER, "runtime.txt")) as f:
        python = f.read().strip().removeprefix("python-")
    assert python in SpecifierSet(pyproject()["requires-python"])
    assert python == f"{sys.version_info[0]}.{sys.version_info[1]}"  # the Python the tests use
    postbuild = os.path.join(BINDER, "postBuild")
    assert os.access(postbuild, os.X_OK)
    with open(postbuild) as f:
        text = f.read()
    # One recipe for Horovod, not two: binder builds it with the project's own script.
    assert 'scripts/build_horovod.sh "$NB_PYTHON_PREFIX"' in text
    assert 'scripts/install_tensorflow.sh "$NB_PYTHON_PREFIX"' in text  # and TensorFlow too
    # TensorFlow first: Horovod is built against it
    assert text.index("bash scripts/install_tensorflow.sh") < \
        text.index("bash scripts/build_horovod.sh")
    assert not re.search(r"pip install[^\n]*horovod", text, re.I)
