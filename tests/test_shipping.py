"""What a cluster's executors get of the notebook's environment, without a cluster: what is
chosen for a job, how it is packed and kept, and what an executor does with it
(`hvd_magic.launch.shipping`, `hvd_magic.task.shipped`). The runs on executors that lack it are
in test_standalone_cluster.py."""

import importlib
import importlib.metadata as metadata
import os
import zipfile

import pytest
from IPython.core.error import UsageError

from hvd_magic.config import RunOptions
from hvd_magic.launch import shipping
from hvd_magic.task import shipped
from own_env import compiled_dist, install, small_wheel


@pytest.fixture
def notebook_site(tmp_path, monkeypatch):
    """A folder on this Python's path that a test installs distributions into."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(shipping, "cache_folder", lambda: str(tmp_path / "packed"))
    monkeypatch.setattr(shipped, "cache_root", lambda: str(tmp_path / "unpacked"))
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
    parcel, path = shipping.pack(metadata.distribution("shipme"))
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
