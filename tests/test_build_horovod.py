"""`python -m hvd_magic.build_horovod`: the patched Horovod build, shipped inside the package.

A user who did `pip install hvd_magic` has no checkout: the recipe and its patches must be in the
wheel, and run from there they must find the same cache key `make setup` used (the same Python,
torch and TensorFlow: the same wheel, in seconds, not a 6-10 minute compile). What would fail
minutes into a compile (no compiler, no `patch`, no torch) is refused at once, in one line.

No test here compiles Horovod: where a run would start a compile, it is a --dry-run, and the one
real run (--wheel-only) goes ahead only once the dry run has said the wheel is cached.
"""

import glob
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile

import pytest

from conftest import ROOT
from hvd_magic import build_horovod

RECIPE = os.path.join(ROOT, "hvd_magic", "horovod_build")
PATCHES = sorted(os.listdir(os.path.join(RECIPE, "patches")))


def command(*args, **env):
    """`python -m hvd_magic.build_horovod ARGS` in a child, with these variables changed."""
    return subprocess.run([sys.executable, "-m", "hvd_magic.build_horovod", *args],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The project's wheel as pip builds it, from a copy of the checkout (pip builds in the tree
    it is given: a stale build/ there would leak old files into the wheel)."""
    tmp = tmp_path_factory.mktemp("wheel")
    tree = tmp / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), tree)
    shutil.copytree(os.path.join(ROOT, "hvd_magic"), tree / "hvd_magic",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp / "dist"), str(tree)],
                   check=True, capture_output=True, text=True)
    (path,) = (tmp / "dist").glob("hvd_magic-*.whl")
    return path


def test_the_recipe_names_every_patch_it_ships():
    with open(os.path.join(RECIPE, "build.sh")) as f:
        named = {f"horovod-$version-{n}.patch" for n in re.findall(r"horovod-\$version-([\w-]+)"
                                                                   r"\.patch", f.read())}
    assert {p.replace("0.28.1", "$version") for p in PATCHES} == named
    assert len(PATCHES) == 7


def test_the_wheel_carries_the_recipe_and_its_patches(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for rel in ["build.sh"] + [f"patches/{p}" for p in PATCHES]:
            inside = f"hvd_magic/horovod_build/{rel}"
            assert inside in names, f"{inside} is not package data"
            with open(os.path.join(RECIPE, rel), "rb") as f:
                assert z.read(inside) == f.read()  # the same bytes: the same cache key
        assert "hvd_magic/build_horovod.py" in names
        assert any(re.fullmatch(r"hvd_magic/launch/[^/]+\.properties", n) for n in names)


def installed_key():
    """Where this environment's Horovod came from (the recipe writes it), or skip."""
    path = os.path.join(sys.prefix, ".horovod-key")
    if not os.path.exists(path):
        pytest.skip("this environment's Horovod was not installed by the recipe (make setup)")
    with open(path) as f:
        key = f.read().strip()
    if not any(n.startswith("horovod-") and n.endswith(".whl") for n in os.listdir(key)):
        pytest.skip(f"the cached wheel is gone from {key}")
    return key


def test_from_the_wheel_alone_it_finds_the_wheel_make_setup_cached(wheel, tmp_path):
    key = installed_key()
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    here = subprocess.run([sys.executable, "-c", "import hvd_magic.build_horovod as m;"
                           "print(m.RECIPE)"], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(site)}).stdout.strip()
    assert here == str(site / "hvd_magic" / "horovod_build" / "build.sh")  # not the checkout's
    # First a dry run: were the key to differ, the real run would compile for minutes.
    dry = command("--wheel-only", "--dry-run", PYTHONPATH=str(site))
    assert dry.returncode == 0, dry.stderr
    assert f"the wheel is cached in {key}: nothing to build" in dry.stdout, dry.stdout
    cached = {path: os.stat(path).st_mtime_ns for path in glob.glob(f"{key}/*.whl")}
    real = command("--wheel-only", PYTHONPATH=str(site))
    assert real.returncode == 0, real.stderr
    assert f"horovod: wheel in {key}" in real.stdout
    # no compile: the cached wheel was found, not built again (the recipe says when it builds)
    assert "horovod: building" not in real.stdout, real.stdout
    assert {path: os.stat(path).st_mtime_ns for path in glob.glob(f"{key}/*.whl")} == cached


def test_the_repository_script_runs_the_packaged_recipe(tmp_path):
    key = installed_key()
    out = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_horovod.sh"), sys.prefix,
                          "--print-wheel-dir"], capture_output=True, text=True, check=True,
                         cwd=tmp_path)
    assert out.stdout.strip() == key


def test_an_uncached_build_says_its_time_disk_and_needs_first(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HVD_MAGIC_CACHE", str(tmp_path / "empty-cache"))
    assert build_horovod.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "not built yet" in out and str(tmp_path / "empty-cache" / "wheels") in out
    assert re.search(r"Time: about \d+-\d+ minutes", out)
    assert f"Disk: about {build_horovod.BUILD_TREE_MB} MB" in out
    assert "(C++17)" in out and "cmake" in out
    assert not (tmp_path / "empty-cache").exists()  # a dry run builds nothing
    # Too little room for the build tree: refused before anything starts.
    monkeypatch.setattr(build_horovod, "free_mb", lambda folder: 100)
    assert build_horovod.main([]) == 2
    err = capsys.readouterr().err
    assert "the build needs about 600 MB" in err and "TMPDIR" in err


@pytest.mark.parametrize("tools, missing", [
    (["bash"], "needs g++ and patch, not found on PATH"),
    (["bash", "g++"], "needs patch, not found on PATH"),
    (["g++", "patch"], "needs bash, not found on PATH"),
])
def test_a_missing_tool_is_refused_in_one_line(tmp_path, tools, missing):
    path = tmp_path / "bin"
    path.mkdir()
    for tool in tools:
        os.symlink(shutil.which(tool), path / tool)
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    out = subprocess.run([sys.executable, "-m", "hvd_magic.build_horovod"], capture_output=True,
                         text=True, timeout=60, env={**env, "PATH": str(path)})
    assert out.returncode == 2
    assert out.stdout == ""  # nothing announced, nothing started
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hvd_magic.build_horovod: building Horovod ")
    assert missing in lines[0] and "apt-get install" in lines[0]


def test_an_environment_without_torch_is_refused(tmp_path):
    venv.create(tmp_path / "env", with_pip=False)
    out = command("--prefix", str(tmp_path / "env"))
    assert out.returncode == 2 and out.stdout == ""
    assert "has no torch and no TensorFlow" in out.stderr
    assert f"{tmp_path / 'env'}/bin/python -m pip install torch" in out.stderr
