"""A format of one's own is one module and one registration: this file defines `dataset.format: zip`
(a zip archive of `class/name.png` members) and nothing else of fastloader changes. Both backends
then read it (DALI: its CPU flavour here) as they read the same images in folders: every sample
once, the same labels, the same pixels.
"""
from __future__ import annotations

import os
import threading
import zipfile

import pytest
from conftest import base_config, identities, write_numbered_dataset

from fastloader import build_loader
from fastloader.errors import ConfigError
from fastloader.sources import Format, Samples, register_format


class ZipSource:
    """The images of a zip archive, one member a sample, labelled by the folder it sits in."""

    def __init__(self, path: str):
        self.path = path
        self.name = path
        self.members: list[str] = []
        self._local = threading.local()

    def _archive(self) -> zipfile.ZipFile:  # one handle a process and thread: a zip handle has a position
        if getattr(self._local, "pid", None) != os.getpid():
            self._local.archive, self._local.pid = zipfile.ZipFile(self.path), os.getpid()
        return self._local.archive

    def samples(self) -> Samples:
        self.members = sorted(name for name in self._archive().namelist() if not name.endswith("/"))
        classes = sorted({name.split("/")[0] for name in self.members})
        return Samples(self.members, [classes.index(name.split("/")[0]) for name in self.members], classes)

    def read(self, item: int) -> bytes:
        return self._archive().read(self.members[item])

    def identity(self) -> str:
        info = os.stat(self.path)
        return f"{info.st_ino}:{info.st_size}:{info.st_mtime_ns}"


def open_zip_split(config, split):
    return ZipSource(**split.source_args)


register_format(Format("zip", open_zip_split, needs_root=False, args=True))


@pytest.fixture
def archive(tmp_path):
    root = write_numbered_dataset(tmp_path / "folders", per_class=5, splits=("val",))
    with zipfile.ZipFile(tmp_path / "val.zip", "w") as archive:
        for path in sorted((root / "val").rglob("*.png")):
            archive.write(path, path.relative_to(root / "val").as_posix())
    return root, tmp_path / "val.zip"


def delivered(loader):
    return [(colour, label) for images, labels in loader for colour, label in zip(identities(images), labels.tolist())]


@pytest.mark.parametrize("backend", ["torch", "dali"])
def test_a_format_of_ones_own_reads_as_its_folders_do_on_both_backends(archive, backend):
    folders, path = archive
    config = base_config(folders, backend=backend, val={"batch_size": 4, "source_args": {"path": str(path)}})
    config["dataset"] = {"format": "zip"}
    zipped = build_loader(config, "val")
    plain = build_loader(base_config(folders, backend=backend), "val")
    assert zipped.classes == plain.classes and zipped.num_samples == 15
    assert delivered(zipped) == delivered(plain)  # the same names in the same order: the same batches


def test_an_unregistered_format_is_named_with_the_registered_ones(tmp_path):
    config = base_config(tmp_path)
    config["dataset"]["format"] = "zpi"
    with pytest.raises(ConfigError, match=r"dataset\.format: expected one of 'folder', .*'zip', got 'zpi'; did you "
                                          r"mean 'zip'\?"):
        build_loader(config, "val")
