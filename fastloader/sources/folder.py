"""ImageFolder trees: root/<split>/<class>/<image>, sorted class folders -> labels 0..C-1; a split's
file_list instead where it has one; `builtin:` roots are the embedded demo, made on first use."""
from __future__ import annotations

import logging
import os
import stat
import time
from typing import Iterator, Sequence

from ..errors import ConfigError
from ..locations import not_regular
from ..samples import IndexBuilder, SampleIndex
from ..schema import IMAGE_EXTENSIONS, Config, SplitConfig
from ..words import plural
from .exclude import read_exclude_list
from .file_list import read_file_list
from .multi import order_split
from .registry import Format, indexed, register_format

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
        return read_file_list(split.file_list, root, config.dataset.classes, excluded, key=f"{split.name}.file_list",
                              weights_key=f"{order_split(split).name}.weights",
                              other_lists=() if config.dataset.classes else _other_file_lists(config, split))
    folder = os.path.normpath(split.folder or split.name)
    skip = frozenset(path[len(folder) + 1:] for path in excluded if path.startswith(folder + os.sep))
    # the folders' problems are blamed on what set dataset.root: the file, or an override
    together = None if config.dataset.classes else _classes_of_the_splits(config, root, split)
    index = scan_folder(os.path.join(root, folder), config.dataset.extensions, config.dataset.classes or together,
                        config.origin("dataset.root"), key=f"{split.name}.folder", skip=skip,
                        announced=together is not None)
    config.on_bad_image.refuse(index.unusable)  # a FIFO named .JPEG: raised, or logged (then listed)
    return index


def _other_file_lists(config: Config, split: SplitConfig) -> list[str]:
    """The config's file lists but `split`'s own: the class names they give join those of its list."""
    lists = [other.file_list for other in config.splits.values()]
    lists += [source.file_list for other in config.splits.values() for source in other.sources or ()]
    return [path for path in dict.fromkeys(lists) if path and path != split.file_list]


def _class_folders(folder: str) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(folder) if _is_dir(e) and not e.name.startswith("."))
    except OSError:
        return []


def _classes_of_the_splits(config: Config, root: str, split: SplitConfig) -> list[str] | None:
    """Without dataset.classes: the class folders of every folder split of the config, together, so
    that a label means one class in each (a val folder without one of train's classes would shift
    every label after it). None where this split's folders are all there are; a class another
    split has and this one lacks is named in a WARNING, its label kept (`announced` to scan_folder)."""
    own_folder = os.path.join(root, os.path.normpath(split.folder or split.name))
    own = _class_folders(own_folder)
    others = {}
    for other in config.splits.values():
        if other.name == split.name or other.file_list or other.shards or other.files or other.sources \
                or other.held_out:
            continue
        folder = os.path.join(root, os.path.normpath(other.folder or other.name))
        if os.path.isdir(folder) and folder != own_folder:
            others[other.name] = _class_folders(folder)
    union = sorted(set(own).union(*others.values()))
    if not own or union == own:
        return None
    for name in (name for name in union if name not in own):
        having = ", ".join(other for other, found in others.items() if name in found)
        log.warning("%s has no class folder %r, which %s has: the classes of every split are kept, so that each "
                    "label means one class in all of them (its label %d, with no samples here); set dataset.classes "
                    "to list the classes yourself", own_folder, name, having, union.index(name))
    return union


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
                source: str = "<dict>", key: str = "dataset.root", skip: frozenset[str] = frozenset(),
                announced: bool = False) -> SampleIndex:
    """ImageFolder convention: sorted class folders -> labels 0..C-1; files in sorted order, recursively.

    A class folder without images keeps its label (so labels stay aligned with other splits) and is
    logged as a warning; a split without any image is an error. Paths in `skip` (relative to
    split_dir, from dataset.exclude) are left out and counted in the log. Links are followed, each
    folder read once (_Walk); an image-named entry that is not a regular file is in `unusable`.
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
        split_name = key.split(".")[0]
        hold = f", hold it out of train ({split_name}.held_out: {{of: train, fraction: 0.1}})" \
            if split_name != "train" and os.path.isdir(os.path.join(parent, "train")) else ""
        raise ConfigError(f"{source}: split folder {split_dir!r} does not exist (folders in dataset.root: "
                          f"{', '.join(present) or 'none'}): make it ({split_dir}/<class>/<images>), set {key} to the "
                          f"folder that holds the split's own images{hold}, or remove the split '{split_name}' from "
                          f"the config")
    found = sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))
    if classes is None:
        classes = found
        if not classes:
            raise ConfigError(f"{source}: {key}: {split_dir!r} has no class folders; expected "
                              f"{split_dir}/<class name>/<image files>")
    else:
        missing = [c for c in classes if c not in found]
        extra = [c for c in found if c not in classes]
        if extra:
            raise ConfigError(f"{source}: dataset.classes: {split_dir!r} ({key}) has class folders not in the list: "
                              f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}; add them to dataset.classes")
        for name in missing if not announced else ():
            log.warning("%s: class %r has no folder in %s; its label is kept, with no samples", source, name, split_dir)

    suffixes = tuple(e.lower() for e in extensions)
    walk = _Walk(split_dir, classes, suffixes, skip)
    builder = IndexBuilder()
    started = last_report = time.monotonic()
    for label, name in enumerate(classes):
        class_dir = os.path.join(split_dir, name)
        if not os.path.isdir(class_dir):
            continue
        before = len(builder)
        for relpath in walk.class_files(name):
            builder.add(relpath, label)
        if len(builder) == before:
            log.warning("class folder %s holds no image files (%s); its label %d is kept, with no samples",
                        class_dir, "/".join(suffixes), label)
        now = time.monotonic()
        if now - last_report > 5:
            log.info("scanning %s: %d/%d classes, %d images so far", split_dir, label + 1, len(classes), len(builder))
            last_report = now
    for link, reason in walk.links:
        log.warning("%s: not followed: %s", link, reason)
    if not len(builder):
        first = f" ({walk.special[0][0]}: {walk.special[0][1]})" if walk.special else ""
        raise ConfigError(f"{source}: {key}: no image files under {split_dir!r} (looked for {', '.join(suffixes)})"
                          f"{first}; check dataset.root and dataset.extensions")
    log.info("indexed %s: %s in %s (%.2fs)%s", split_dir, plural(len(builder), "image"), plural(len(classes), "class"),
             time.monotonic() - started, f", {walk.skipped} left out by dataset.exclude" if walk.skipped else "")
    return builder.build(split_dir, classes, excluded=walk.skipped, unusable=walk.special)


class _Walk:
    """The image files under a split's class folders, in os.walk's order (a folder's files sorted,
    then its sub-folders sorted), following symbolic links, yet reading each folder once.

    Why not os.walk(followlinks=True): a link back up the tree (`c00/loop -> .`) repeats the files
    until the path is too long, two self-loops never end, and a link into another class folder gives
    that class's files this class's label. Here a link is not followed when it leads into a class
    folder of the split (those files are indexed under their own path and label) or to a folder
    already read (a loop, or a second link to the same folder): it is named in a warning instead.
    Files that are not regular (a FIFO, a socket, a device named `.JPEG`) are named as unusable,
    never opened."""

    def __init__(self, split_dir: str, classes: Sequence[str], suffixes: tuple[str, ...], skip: frozenset[str]):
        self.split_dir, self.suffixes, self.skip = split_dir, suffixes, skip
        self.class_dirs: dict[str, str] = {}
        """The real path of each class folder -> its class (a folder, rather than a link, where two are one)."""
        for name in sorted(classes, key=lambda name: os.path.islink(os.path.join(split_dir, name))):
            self.class_dirs.setdefault(os.path.realpath(os.path.join(split_dir, name)), name)
        self.visited: set[tuple[int, int]] = set()
        self.links: list[tuple[str, str]] = []
        """(link, why it was not followed)."""
        self.special: list[tuple[str, str]] = []
        """(path, reason) of each image-named entry that is not a regular file."""
        self.skipped = 0
        """Files left out by dataset.exclude."""

    def class_files(self, name: str) -> Iterator[str]:
        """The relative paths of a class folder's image files (none when the folder is a link to another class's)."""
        folder = os.path.join(self.split_dir, name)
        reason = self._link_problem(folder, own=name) if os.path.islink(folder) else None
        if reason:
            self.links.append((folder, reason))
            return iter(())
        return self.files(folder, name)

    def files(self, folder: str, relative: str) -> Iterator[str]:
        """The relative paths of the image files under `folder` (itself at `relative`)."""
        try:
            info = os.stat(folder)
            entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
        except OSError:
            return  # as os.walk: a folder that cannot be listed holds nothing
        identity = (info.st_dev, info.st_ino)
        if identity in self.visited:
            self.links.append((folder, "it leads to a folder already read (a loop, or a second path to it)"))
            return
        self.visited.add(identity)
        folders = []
        for entry in entries:
            if _is_dir(entry):
                folders.append(entry)
            elif entry.name.lower().endswith(self.suffixes):
                path = os.path.normpath(os.path.join(relative, entry.name))
                if path in self.skip:
                    self.skipped += 1
                    continue
                reason = _not_a_file(entry)
                if reason:
                    self.special.append((entry.path, reason))
                else:
                    yield path
        for entry in folders:
            reason = self._link_problem(entry.path) if entry.is_symlink() else None
            if reason:
                self.links.append((entry.path, reason))
            else:
                yield from self.files(entry.path, os.path.join(relative, entry.name))

    def _link_problem(self, link: str, own: str | None = None) -> str | None:
        """Why a link to a folder is not followed: it leads into a class folder of the split (other
        than `own`, the class folder that the link itself is)."""
        target = os.path.realpath(link)
        folder = target
        while True:
            name = self.class_dirs.get(folder)
            if name is not None and not (name == own and folder == target):
                inside = "" if folder == target else f" (to {target}, inside it)"
                return f"a link to class folder {name!r}{inside}: its files are indexed once, under their own path"
            parent = os.path.dirname(folder)
            if parent == folder:
                return None
            folder = parent


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:
        return False


def _not_a_file(entry: os.DirEntry) -> str | None:
    """Why an entry named like an image is not one to index: a FIFO, socket or device (a broken link
    is indexed, and screening names it); None for a regular file."""
    try:
        if entry.is_file():
            return None
        return not_regular(entry.stat().st_mode)
    except OSError:
        return None  # a broken link, or gone: the readers name it


register_format(Format("folder", indexed(index_split), keys=("folder", "file_list")))
