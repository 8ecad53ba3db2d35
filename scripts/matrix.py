"""`make matrix`: the support matrix (docs/install.md) tried as a new user meets it.

For each combination of Python, torch, pyspark and ipykernel below: a fresh venv of that Python
(pyenv's, or `$MATRIX_PYTHON_3_12`...), the wheel built from this checkout installed by pip with
`[spark]` and the combination's torch (from PyPI: on Linux its CUDA build, which runs on the CPU
here), pyspark and ipykernel, then one slice of the suite run there against the installed wheel
(never the checkout's source: pytest runs from the venv's own `bin/`). Horovod and TensorFlow are
not installed: the slice is what runs without them.

The venvs live in ~/.cache/hvd_magic/matrix/ (`$HVD_MAGIC_MATRIX`), made again each time; pip's
own cache keeps the downloads (torch with its CUDA wheels: ~4 GB a Python, once). The table
of results is printed and written between the markers in docs/install.md.

    python scripts/matrix.py                 # every combination
    python scripts/matrix.py 3.12 3.13       # only those Pythons' rows
    python scripts/matrix.py --keep          # reuse venvs already made (a rerun of the tests)
"""

import argparse
import collections
import datetime
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOME = os.environ.get("HVD_MAGIC_MATRIX", os.path.expanduser("~/.cache/hvd_magic/matrix"))

Combo = collections.namedtuple("Combo", "python torch pyspark ipykernel extra")

# What our users run (docs/install.md): Databricks runtimes (3.10 with Spark 3.5, 3.12 with
# Spark 4), Colab and JupyterHub (3.12), laptops (3.13), with the torch pip picks; the oldest
# torch we claim (3.11 and Spark 3.5: Databricks 15). 3.11 with torch 2.13 is `make test`.
COMBOS = [
    Combo("3.10", "2.14.1", "3.5", "6", ()),
    Combo("3.12", "2.14.1", "4", "7", ()),
    Combo("3.13", "2.14.1", "4", "7", ()),
    Combo("3.11", "2.3.1", "3.5", "6", ("numpy<2",)),  # torch < 2.4 was built against numpy 1
]

# The slice: each area of the table and the tests that try it. None of them needs Horovod or
# TensorFlow; each runs on every combination.
SLICE = {
    "capture": ["tests/test_capture.py::test_rank_imports_happen_in_the_body",
                "tests/test_capture.py::test_a_failing_cell_names_its_prompt_and_the_editors_line",
                "tests/test_capture.py::test_api_runs_functions_defined_anywhere",
                "tests/test_capture.py::test_capture_values[notebook function calling another]",
                "tests/test_capture.py::test_capture_values[notebook class]"],
    "job reading": ["tests/test_reading.py"],
    "--np -2 DDP": ["tests/test_ddp.py::test_init_process_group_with_no_argument",
                    "tests/test_ddp.py::test_ddp_averages_the_ranks_gradients[driver]"],
    "--np 2 Spark": ["tests/test_ddp.py::test_ddp_averages_the_ranks_gradients[spark]"],
    "elastic DDP": ["tests/test_elastic_ddp.py::test_a_rank_that_raises_ends_the_run_with_its_"
                    "traceback",
                    "tests/test_elastic_ddp.py::test_survivors_of_a_killed_rank_go_on_and_train_"
                    "what_one_process_would[driver]"],
    "--timeline": ["tests/test_timeline_ranks.py::test_every_ranks_profile_merged_says_who_the_"
                   "others_waited_for[driver]",
                   "tests/test_timeline_ranks.py::test_a_timeline_that_records_no_step_says_so"],
    "%debug frames": ["tests/test_debugging.py::test_debug_after_a_rank_failed_opens_its_frames_"
                      "with_their_locals",
                      "tests/test_debugging.py::test_a_cell_has_one_name_and_its_wrapper_none_in_"
                      "what_a_person_reads"],
    "shipping": ["tests/test_shipping.py"],
    "kernel": ["tests/test_tracebacks.py::test_a_one_off_cells_traceback_names_its_prompt_and_"
               "the_editors_line"],
}
# What the slice's tests import besides hvd_magic's own dependencies.
TEST_PACKAGES = ["pytest>=7", "pytest-timeout>=2", "hypothesis>=6", "numpy", "jupyter_client>=8",
                 "nbformat>=5.9", "pyyaml", "setuptools>=70.1"]  # (a test builds a wheel)
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"


def interpreter(version):
    """The python of `version` ("3.12"): `$MATRIX_PYTHON_3_12`, else pyenv's newest 3.12.x."""
    named = os.environ.get("MATRIX_PYTHON_" + version.replace(".", "_"))
    if named:
        return named
    root = os.path.expanduser(os.environ.get("PYENV_ROOT", "~/.pyenv"))
    found = sorted((v for v in os.listdir(os.path.join(root, "versions"))
                    if v.startswith(version + ".") and v[len(version) + 1:].isdigit()),
                   key=lambda v: int(v.rsplit(".", 1)[1])) \
        if os.path.isdir(os.path.join(root, "versions")) else []
    if not found:
        sys.exit(f"no Python {version}: `pyenv install {version}`, or set "
                 f"MATRIX_PYTHON_{version.replace('.', '_')} to its python")
    return os.path.join(root, "versions", found[-1], "bin", "python")


def build_wheel(dest):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", dest,
                    ROOT], check=True)
    (wheel,) = [n for n in os.listdir(dest) if n.endswith(".whl")]
    return os.path.join(dest, wheel)


def requirements(combo, wheel):
    major = int(combo.pyspark.split(".")[0])
    pyspark = f"pyspark>={combo.pyspark},<{combo.pyspark}.999" if "." in combo.pyspark \
        else f"pyspark>={major},<{major + 1}"
    kernel = int(combo.ipykernel)
    return [f"{wheel}[spark]", f"torch=={combo.torch}", pyspark,
            f"ipykernel>={kernel},<{kernel + 1}", *combo.extra, *TEST_PACKAGES]


def install(combo, wheel, env, keep, log):
    """The venv `env` with the combination installed; its pip's output goes to `log`."""
    python = os.path.join(env, "bin", "python")
    if keep and os.path.exists(python):
        subprocess.run([python, "-m", "pip", "install", "--no-deps", "--force-reinstall",
                        f"{wheel}[spark]"], check=True, stdout=log, stderr=log)
        subprocess.run([python, "-m", "pip", "install", *TEST_PACKAGES], check=True, stdout=log,
                       stderr=log)
        return python
    shutil.rmtree(env, ignore_errors=True)
    subprocess.run([interpreter(combo.python), "-m", "venv", env], check=True)
    subprocess.run([python, "-m", "pip", "install", *requirements(combo, wheel)],
                   check=True, stdout=log, stderr=log)
    return python


def versions(python):
    code = ("import sys, platform, torch, pyspark, ipykernel, hvd_magic, os;"
            "print(platform.python_version(), torch.__version__, pyspark.__version__,"
            " ipykernel.__version__, os.path.dirname(hvd_magic.__file__))")
    return subprocess.run([python, "-c", code], check=True, capture_output=True,
                          text=True, cwd="/").stdout.split()


def run_slice(env, log):
    """{area: (passed, failed, skipped)} of the slice, run in `env`'s own pytest."""
    report = os.path.join(env, "slice.xml")
    tests = [t for area in SLICE.values() for t in area]
    subprocess.run([os.path.join(env, "bin", "pytest"), "-p", "no:cacheprovider", "-q",
                    "--junitxml", report, *tests], cwd=ROOT, stdout=log, stderr=log,
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    outcome = {}
    for case in ET.parse(report).iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        outcome[f"{case.get('classname')}::{case.get('name')}"] = \
            "failed" if failed else "skipped" if skipped else "passed"
    results = {}
    for area, tests in SLICE.items():
        counts = collections.Counter()
        for test in tests:
            prefix = test.replace("/", ".").replace(".py", "").split("::")
            for name, result in outcome.items():
                case_file, case_name = name.rsplit("::", 1)
                if case_file == prefix[0] and (len(prefix) == 1 or case_name == prefix[1] or
                                               case_name.startswith(prefix[1] + "[")):
                    counts[result] += 1
        results[area] = counts
    return results


def cell(counts):
    if not counts:
        return "not run"
    if counts["failed"]:
        return f"**{counts['failed']} failed** of {sum(counts.values())}"
    return f"ok ({counts['passed']})" + (f", {counts['skipped']} skipped"
                                         if counts["skipped"] else "")


def table(rows):
    head = ["Python", "torch", "pyspark", "ipykernel", "install", *SLICE,
            "time (install + slice)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def record(text):
    """The table between the markers in docs/install.md."""
    path = os.path.join(ROOT, "docs", "install.md")
    with open(path) as f:
        doc = f.read()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    with open(path, "w") as f:
        f.write(doc[:start] + "\n" + text + "\n" + doc[end:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pythons", nargs="*", help="only these Pythons' rows (3.12...)")
    parser.add_argument("--keep", action="store_true", help="reuse the venvs already made")
    parser.add_argument("--no-record", action="store_true", help="leave docs/install.md as is")
    args = parser.parse_args()
    os.makedirs(HOME, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="wheel-", dir=HOME)  # (its own: a second run beside it)
    try:
        return _rows(args, build_wheel(folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _rows(args, wheel):
    rows = []
    for combo in COMBOS:
        if args.pythons and combo.python not in args.pythons:
            continue
        name = f"py{combo.python}-torch{combo.torch}-spark{combo.pyspark}-ipykernel" \
               f"{combo.ipykernel}"
        env = os.path.join(HOME, name)
        os.makedirs(HOME, exist_ok=True)
        start = time.monotonic()
        with open(os.path.join(HOME, name + ".log"), "w") as log:
            print(f"{name}: installing ({log.name})", flush=True)
            try:
                python = install(combo, wheel, env, args.keep, log)
                found = versions(python)
            except subprocess.CalledProcessError as exc:
                rows.append([combo.python, combo.torch, combo.pyspark, combo.ipykernel,
                             f"**failed** ({exc.returncode})", *["not run"] * len(SLICE), ""])
                continue
            assert found[4].startswith(env), f"hvd_magic imported from {found[4]}, not the venv"
            print(f"{name}: the slice ({' '.join(found[:4])})", flush=True)
            installed = time.monotonic()
            results = run_slice(env, log)
        minutes = f"{(installed - start) / 60:.0f} + {(time.monotonic() - installed) / 60:.0f} min"
        rows.append([*found[:4], "ok", *(cell(results[a]) for a in SLICE), minutes])
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    text = table(rows) + f"\n\n(`make matrix`, {datetime.date.today()}, on {os.uname().sysname} " \
        f"{os.uname().machine}, {os.cpu_count()} cores)"
    print(text)
    if not args.no_record and not args.pythons:
        record(text)
    return 0 if all("failed" not in " ".join(r) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
