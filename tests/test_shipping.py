"""What a cluster's executors get of the notebook's environment, without a cluster: what is
chosen for a job, how it is packed and kept, and what an executor does with it
(`hvd_magic.launch.shipping`, `hvd_magic.task.shipped`). The runs on executors that lack it are
in test_standalone_cluster.py."""

import fcntl
import importlib
import importlib.metadata as metadata
import os
import signal
import subprocess
import sys
import time
import zipfile

import pytest
from IPython.core.error import UsageError

from hvd_magic.config import RunOptions
from hvd_magic.launch import shipping
from hvd_magic.task import caches, shipped
from own_env import compiled_dist, install, small_wheel


@pytest.fixture
def notebook_site(tmp_path, monkeypatch):
    """A folder on this Python's path that a test installs distributions into."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(shipping, "cache_folder", lambda: str(tmp_path / "packed"))
    monkeypatch.setattr(shipped, "cache_root", lambda: str(tmp_path / "unpacked"))
    monkeypatch.setattr(shipped, "_arrived", {})  # (not an earlier test's folders)
    return site


def names(dists):
    return [shipping.normalized(d.metadata["Name"]) for d in dists]


def test_a_job_gets_hvd_magic_what_its_ranks_need_and_what_it_imports_less_the_frameworks():
    got = names(shipping.chosen(["torch.nn", "horovod.torch", "yaml", "pandas", "os", "json"]))
    assert got[:3] == ["hvd-magic", "cloudpickle", "psutil"]
    assert "numpy" in names(shipping.chosen(["torch"]))  # (torch uses it, not requires it)
    assert {"pyyaml", "pandas", "numpy", "python-dateutil"} <= set(got)  # pandas's own too
    assert not {"torch", "horovod"} & set(got)
    assert names(shipping.chosen(["yaml"], only=())) == ["hvd-magic", "cloudpickle", "psutil"]
    assert "pyyaml" in names(shipping.chosen([], only=("PyYAML",)))
    with pytest.raises(UsageError, match="--ship nosuchthing: no distribution of that name"):
        shipping.chosen([], only=("nosuchthing",))


def test_the_ship_option_takes_none_names_or_a_list():
    assert RunOptions().ship is None
    assert RunOptions(ship="none").ship == ()
    assert RunOptions(ship="mylib, other").ship == ("mylib", "other")
    assert RunOptions(ship=["mylib"]).ship == ("mylib",)
    with pytest.raises(UsageError, match="ship takes the names of distributions"):
        RunOptions(ship=3)


def test_a_package_installed_minutes_ago_is_packed_once_and_again_when_it_changes(
        notebook_site, tmp_path):
    install(str(notebook_site) + "/", small_wheel(str(tmp_path), "shipme", "1.0", "X = 1\n"))
    assert "shipme" in names(shipping.chosen(["shipme"]))  # found though installed just now
    packed = tmp_path / "packed"
    packed.mkdir()
    for old in ("unused-1.0-0123.zip", "killed-1.0-0123.zip.part-1234"):  # (weeks ago)
        (packed / old).write_text("")
        os.utime(packed / old, (time.time() - 20 * 86400,) * 2)
    parcel, path = shipping.pack(metadata.distribution("shipme"))
    assert sorted(os.listdir(packed)) == [parcel.file, parcel.file + ".lock"]  # (old: pruned)
    assert (parcel.name, parcel.version, parcel.suffixes, parcel.always) == \
        ("shipme", "1.0", (), False)
    listed = zipfile.ZipFile(path).namelist()
    assert "shipme/__init__.py" in listed and "shipme-1.0.dist-info/METADATA" in listed
    assert shipping.pack(metadata.distribution("shipme")) == (parcel, path)  # kept
    again = tmp_path / "again"
    install(str(again) + "/", small_wheel(str(again), "shipme", "1.0", "X = 2\n"))
    (notebook_site / "shipme" / "__init__.py").write_text("X = 2\n")
    (notebook_site / "shipme-1.0.dist-info" / "RECORD").write_text(
        (again / "shipme-1.0.dist-info" / "RECORD").read_text())
    changed, _ = shipping.pack(metadata.distribution("shipme"))
    assert changed.file != parcel.file  # another content, another name


def test_an_executor_uses_what_it_lacks_keeps_its_own_and_refuses_what_cannot_run(
        notebook_site, tmp_path):
    install(str(notebook_site) + "/", small_wheel(str(tmp_path), "shipme", "1.0", "X = 1\n"))
    compiled_dist(str(notebook_site), "fastlib", "2.0", "cp311-abi3-manylinux_2_99_x86_64")
    parcels, paths = zip(*(shipping.pack(metadata.distribution(n))
                           for n in ("shipme", "fastlib")))
    fetched = {p.file: path for p, path in zip(parcels, paths)}.__getitem__
    assert parcels[1].glibc == "2.99" and parcels[1].suffixes == (".abi3.so",)

    # here both are installed at the notebook's versions: nothing to use, nothing refused
    assert shipped.arrive(parcels, fetched) == ([], [])

    os.remove(notebook_site / "shipme-1.0.dist-info" / "METADATA")  # "an executor without it"
    importlib.invalidate_caches()
    shipped._arrived.clear()
    folders, refused = shipped.arrive(parcels[:1], fetched)
    assert refused == []
    assert folders == [os.path.join(shipped.cache_root(), parcels[0].file[:-4])]
    assert open(os.path.join(folders[0], "shipme", "__init__.py")).read() == "X = 1\n"

    older = shipped.Parcel("fastlib", "3.0", "fastlib-3.0-x.zip", 1, suffixes=(".abi3.so",),
                           glibc="2.99", built_for="Python 3.11 (x86_64)")
    folders, refused = shipped.arrive((older,), fetched)
    assert folders == [] and len(refused) == 1
    assert refused[0].startswith("fastlib 3.0 from the notebook (Python 3.11 (x86_64)) cannot run "
                                 "on this executor's Python")
    assert "it needs glibc 2.99 or newer; the executor has fastlib 2.0." in refused[0]
    for odd, why in ((dict(machine="aarch64"), "its compiled modules are for aarch64"),
                     (dict(suffixes=(".cpython-399-x86_64-linux-gnu.so",)),
                      "which this Python does not load")):
        assert why in shipped.unfit(shipped.Parcel("p", "1", "p.zip", 1, **odd))


def test_horovod_env_says_what_a_run_on_a_cluster_sends():
    line = shipping.what_ships("spark://10.0.0.1:7077")
    assert line.startswith("Runs on this cluster send hvd_magic ")
    assert "cloudpickle" in line and "psutil" in line and " MB)" in line
    assert "send nothing" in shipping.what_ships("local[4]")


def test_hvd_magic_from_a_checkout_pip_never_installed_ships_too(monkeypatch, tmp_path):
    real = metadata.distribution

    def unlisted(name):
        if shipping.normalized(name) == "hvd-magic":
            raise metadata.PackageNotFoundError(name)
        return real(name)
    monkeypatch.setattr(shipping.metadata, "distribution", unlisted)
    monkeypatch.setattr(shipping, "cache_folder", lambda: str(tmp_path))
    monkeypatch.setattr(shipping, "_chosen", {})  # (not what an earlier test chose)
    ours = shipping.chosen(["yaml"], only=())[0]
    assert isinstance(ours, shipping._Unlisted)
    parcel, path = shipping.pack(ours)
    assert (parcel.name, parcel.always) == ("hvd_magic", True)
    assert "hvd_magic/task/shipped.py" in zipfile.ZipFile(path).namelist()


def test_a_namespace_import_ships_the_distribution_that_holds_that_module(
        notebook_site, tmp_path, monkeypatch):
    """Two distributions share top-level ``nsdemo`` (as google-auth and protobuf share
    ``google``): each import gets the one whose RECORD lists its module, never the first that
    lists the top-level name."""
    for name, site, package in (("alpha", notebook_site, "nsdemo.alpha"),
                                ("beta", tmp_path / "other-site", "nsdemo.beta"),
                                ("gamma", tmp_path / "third-site", "nsdemo.deep.gamma")):
        install(str(site) + "/", small_wheel(
            str(tmp_path), f"nsdemo-{name}", "1.0", f"NAME = {name!r}\n", package))
        monkeypatch.syspath_prepend(str(site))  # (pip --target makes one nsdemo/ a folder)
    assert not (notebook_site / "nsdemo" / "__init__.py").exists()  # (a namespace package)
    of = shipping.distribution_of
    assert of("nsdemo.alpha").metadata["Name"] == "nsdemo-alpha"
    assert of("nsdemo.beta").metadata["Name"] == "nsdemo-beta"
    assert of("nsdemo.beta.NAME").metadata["Name"] == "nsdemo-beta"  # (from nsdemo.beta import..)
    assert of("nsdemo.deep.gamma").metadata["Name"] == "nsdemo-gamma"  # (below a namespace's)
    assert of("nsdemo") is None and of("nsdemo.deep") is None
    assert not [name for name in sys.modules if name.startswith("nsdemo")]  # (none imported)
    got = names(shipping.chosen(["nsdemo", "nsdemo.beta", "nsdemo.beta.NAME"]))
    assert "nsdemo-beta" in got and "nsdemo-alpha" not in got
    assert "nsdemo-alpha" in names(shipping.chosen(["nsdemo", "nsdemo.alpha"]))
    assert of("google.protobuf.json_format").metadata["Name"] == "protobuf"
    if importlib.util.find_spec("google.auth") is not None:  # (where google-auth is installed)
        assert of("google.auth").metadata["Name"] == "google-auth"
        assert of("google.auth.transport.requests").metadata["Name"] == "google-auth"
        if importlib.util.find_spec("google.rpc") is not None:  # (googleapis-common-protos)
            assert of("google.rpc.status_pb2").metadata["Name"] == "googleapis-common-protos"
        assert "protobuf" not in names(shipping.chosen(["google", "google.auth"]))


def test_a_cache_folder_another_user_owns_or_can_write_to_is_never_used(
        notebook_site, tmp_path, capfd, monkeypatch):
    """The temp folder's cache of unpacked parcels, made by another user (or open to others, or
    a symbolic link) before this one's first run, holding a folder of the very name a parcel
    unpacks to: nothing of it reaches the rank's path; the parcel is unpacked into a private
    folder instead, and the executor's log says why."""
    install(str(notebook_site) + "/", small_wheel(str(tmp_path), "cloudpickle", "0.0.1",
                                                  "X = 'shipped'\n"))
    dist = metadata.distribution("cloudpickle")
    assert dist.version == "0.0.1"
    parcel, path = shipping.pack(dist)
    assert parcel.worker  # (one the Python worker puts on its own path too)
    os.remove(notebook_site / "cloudpickle-0.0.1.dist-info" / "METADATA")  # "lacks it"
    importlib.invalidate_caches()
    cases = {"belongs to uid 65534": (65534, 0o700, False),
             "is open to other users (mode 0777, not 0700)": (os.getuid(), 0o777, False),
             "is not a folder but a symbolic link": (os.getuid(), 0o700, True)}
    for why, (owner, mode, link) in cases.items():
        planted_root = tmp_path / f"planted-{owner}-{mode:o}-{link}"
        planted = planted_root / parcel.file[:-len(".zip")] / "cloudpickle"
        planted.mkdir(parents=True)
        (planted / "__init__.py").write_text("X = 'planted'\n")
        for folder in (planted_root, planted.parent, planted):
            os.chown(folder, owner, owner)
        planted_root.chmod(mode)
        root = tmp_path / "link" if link else planted_root
        if link:
            root.symlink_to(planted_root)
        monkeypatch.setattr(shipped, "cache_root", lambda root=root: str(root))
        shipped._arrived.clear()
        folders, refused = shipped.arrive((parcel,), {parcel.file: path}.__getitem__)
        assert refused == [] and len(folders) == 1
        assert not folders[0].startswith((str(root) + os.sep, str(planted_root) + os.sep))
        assert open(os.path.join(folders[0], "cloudpickle", "__init__.py")).read() == \
            "X = 'shipped'\n"
        assert folders[0] in sys.path
        assert not [p for p in sys.path if p.startswith((str(root), str(planted_root)))]
        assert (planted / "__init__.py").read_text() == "X = 'planted'\n"  # (not touched)
        said = capfd.readouterr().err
        assert f"hvd_magic: {root} {why}" in said and "nothing in it is used" in said


# A process that uses cache entry argv[2] of folder argv[1] (making it, where absent, with a
# file, then waiting) and holds it until its stdin closes.
HOLDER = """
import os, sys
from hvd_magic.task.caches import Cache
def make(part):
    os.makedirs(part)
    open(os.path.join(part, "f"), "w").write("x" * 1000)
    print("making", flush=True)
    sys.stdin.read()
Cache(sys.argv[1]).use(sys.argv[2], make)
print("held", flush=True)
sys.stdin.read()
"""


def _holder(root, name):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(root), name],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return proc, proc.stdout.readline().strip()


def test_caches_are_pruned_by_age_and_size_never_what_a_process_holds_or_makes(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    now = time.time()
    ages = {"recent": 3600, "newer": 7200, "older": 2 * 86400, "held": 20 * 86400,
            "ancient": 20 * 86400 + 1}
    for name in ages:
        (root / name).mkdir()
        (root / name / "f").write_text("x" * 1000)
    holder, said = _holder(root, "held")
    maker, making = _holder(root, "made")  # (stopped while it makes its entry)
    try:
        assert (said, making) == ("held", "making")
        for name, age in ages.items():
            os.utime(root / name, (now - age, now - age))
        (part,) = [n for n in os.listdir(root) if n.startswith("made.part-")]
        pruned = caches.Cache(str(root), max_bytes=1500).prune(now)
        # over 1500 bytes: not what was used within a day; past 14 days: not what is held
        assert pruned == ["older", "ancient"]
        assert sorted(n for n in os.listdir(root) if not n.endswith(".lock")) == \
            ["held", "made.part-" + part.split(".part-")[1], "newer", "recent"]
        maker.kill()  # (a killed unpacker: its part is left, its lock freed)
        maker.wait()
        assert os.path.isdir(root / part)
        assert caches.Cache(str(root), max_bytes=1500).prune(now) == []
        assert not os.path.exists(root / part) and not os.path.exists(root / "made.lock")
        path, made = caches.Cache(str(root)).use("made", lambda p: os.makedirs(p))
        assert made and os.path.isdir(path) and os.path.getmtime(path) >= now

        def broken(part):  # (a zip Spark brought half)
            os.makedirs(part)
            raise zipfile.BadZipFile("File is not a zip file")
        with pytest.raises(zipfile.BadZipFile):
            caches.Cache(str(root)).use("broken", broken)
        assert not [n for n in os.listdir(root) if n.startswith("broken")][1:]  # (its lock)
        with open(root / "broken.lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (free: the next worker makes it)
    finally:
        for proc in (holder, maker):
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
