"""ImageFolder trees: root/<split>/<class>/<image>, sorted class folders -> labels 0..C-1; a split's
file_list instead where it has one; `builtin:` roots are the embedded demo, made on first use."""
from __future__ import annotations

import logging
import os
import stat
import time
from typing import Sequence

from ..errors import ConfigError
from ..samples import IndexBuilder, SampleIndex
from ..schema import IMAGE_EXTENSIONS, Config, SplitConfig
from ..words import plural
from .exclude import read_exclude_list
from .file_list import read_file_list

log = logging.getLogger("fastloader")


def dataset_root(config: Config) -> str:
    """dataset.root as a folder (a builtin dataset is generated on first use)."""
    root = config.dataset.root
    if root.startswith("builtin:"):
        from ..demo import builtin_dataset_root
        root = builtin_dataset_root(root, config.origin("dataset.root"))
    return root


def index_split(config: Config, split: SplitConfig) -> SampleIndex:
    """The split's samples, from its file list or from root/<folder>/<class>/... folders."""
    if split.shards:
        raise ConfigError(f"{config.origin(f'{split.name}.shards')}: {split.name}.shards: tar shards need "
                          f"dataset.format: webdataset (dataset.format is folder); set it, or remove the key")
    root = dataset_root(config)
    excluded = read_exclude_list(config.dataset.exclude, root) if config.dataset.exclude else frozenset()
    if split.file_list:
        return read_file_list(split.file_list, root, config.dataset.classes, excluded)
    folder = os.path.normpath(split.folder or split.name)
    skip = frozenset(path[len(folder) + 1:] for path in excluded if path.startswith(folder + os.sep))
    # the folders' problems are blamed on what set dataset.root: the file, or an override
    return scan_folder(os.path.join(root, folder), config.dataset.extensions, config.dataset.classes,
                       config.origin("dataset.root"), key=f"{split.name}.folder", skip=skip)


def _not_a_folder(path: str) -> str:
    """What a path that should be a folder is instead: missing, a file, a FIFO, a broken link ..."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path!r} is a symbolic link to nothing" if os.path.islink(path) else \
            f"folder {path!r} does not exist"
    except OSError as error:
        return f"{path!r} cannot be read ({error.strerror or error})"
    kinds = ((stat.S_ISREG, "a file"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    kind = next((name for test, name in kinds if test(mode)), "not a folder")
    return f"{path!r} is {kind}, not a folder"


def _holds_images(folder: str, names: Sequence[str], looked_at: int = 3) -> bool:
    """Whether the first few sub-folders hold image files themselves (class folders, not split folders)."""
    for name in names[:looked_at]:
        try:
            with os.scandir(os.path.join(folder, name)) as entries:
                if any(entry.name.lower().endswith(IMAGE_EXTENSIONS) for entry in entries):
                    return True
        except OSError:
            continue
    return False


def scan_folder(split_dir: str, extensions: Sequence[str], classes: Sequence[str] | None = None,
                source: str = "<dict>", key: str = "dataset.root", skip: frozenset[str] = frozenset()) -> SampleIndex:
    """ImageFolder convention: sorted class folders -> labels 0..C-1; files in sorted order, recursively.

    A class folder without images keeps its label (so labels stay aligned with other splits) and is
    logged as a warning; a split without any image is an error. Paths in `skip` (relative to
    split_dir, from dataset.exclude) are left out and counted in the log.
    """
    if not os.path.isdir(split_dir):
        parent = os.path.dirname(split_dir.rstrip(os.sep))
        if not os.path.isdir(parent):
            raise ConfigError(f"{source}: dataset.root: {_not_a_folder(parent)}; set dataset.root to the folder that "
                              f"holds the split folders (or pass --set dataset.root=PATH)")
        present = sorted(e.name for e in os.scandir(parent) if e.is_dir())
        above = os.path.dirname(parent)
        split = os.path.basename(split_dir.rstrip(os.sep))
        if present and os.path.isdir(os.path.join(above, split)) and _holds_images(parent, present):
            raise ConfigError(f"{source}: dataset.root {parent!r} is a split folder itself, one level too deep: its "
                              f"folders ({', '.join(present[:3])}{' ...' if len(present) > 3 else ''}) hold images, "
                              f"and {split!r} is beside it; set dataset.root to {above!r} (--set "
                              f"dataset.root={above}), the folder that holds the split folders")
        raise ConfigError(f"{source}: split folder {split_dir!r} does not exist (folders in dataset.root: "
                          f"{', '.join(present) or 'none'}); set {key} to one of them")
    found = sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))
    if classes is None:
        classes = found
        if not classes:
            raise ConfigError(f"{source}: {split_dir!r} has no class folders; expected "
                              f"{split_dir}/<class name>/<image files>")
    else:
        missing = [c for c in classes if c not in found]
        extra = [c for c in found if c not in classes]
        if extra:
            raise ConfigError(f"{source}: dataset.classes: {split_dir!r} has class folders not in the list: "
                              f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}; add them to dataset.classes")
        for name in missing:
            log.warning("%s: class %r has no folder in %s; its label is kept, with no samples", source, name, split_dir)

    suffixes = tuple(e.lower() for e in extensions)
    builder = IndexBuilder()
    skipped = 0
    started = last_report = time.monotonic()
    for label, name in enumerate(classes):
        class_dir = os.path.join(split_dir, name)
        if not os.path.isdir(class_dir):
            continue
        before = len(builder)
        for dirpath, dirnames, filenames in os.walk(class_dir, followlinks=True):
            dirnames.sort()
            rel_dir = os.path.relpath(dirpath, split_dir)
            for filename in sorted(filenames):
                if filename.lower().endswith(suffixes):
                    relpath = os.path.normpath(os.path.join(rel_dir, filename))
                    if relpath in skip:
                        skipped += 1
                    else:
                        builder.add(relpath, label)
        if len(builder) == before:
            log.warning("class folder %s holds no image files (%s); its label %d is kept, with no samples",
                        class_dir, "/".join(suffixes), label)
        now = time.monotonic()
        if now - last_report > 5:
            log.info("scanning %s: %d/%d classes, %d images so far", split_dir, label + 1, len(classes), len(builder))
            last_report = now
    if not len(builder):
        raise ConfigError(f"{source}: no image files under {split_dir!r} (looked for {', '.join(suffixes)}); "
                          f"check dataset.root and dataset.extensions")
    log.info("indexed %s: %s in %s (%.2fs)%s", split_dir, plural(len(builder), "image"), plural(len(classes), "class"),
             time.monotonic() - started, f", {skipped} left out by dataset.exclude" if skipped else "")
    return builder.build(split_dir, classes, excluded=skipped)
