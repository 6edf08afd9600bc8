"""A map-style `torch.utils.data.Dataset` one already has, as a source: `from_dataset(ds)`.

Its items are (image, label) pairs (or dicts with `image` and `label` keys, as Hugging Face's
datasets give them), the image one of: encoded bytes (fastest: read as they are,
decoded by nvJPEG on the GPU and cropped before decoding on the CPU), a path of an image file (read
as a file is), or a decoded image (a PIL image, a uint8 array or tensor), which becomes a PPM for the
decoders: a copy of its pixels, and neither a crop before decoding nor nvJPEG can apply. What the
first item is, and what it costs, is logged when the loader is built.

The labels are the dataset's `targets` (torchvision's ImageFolder, CIFAR, ...) where it has them;
else each item is read once for its label when the loader is built (logged, as it costs a pass).
A label is a class number: an int, a numpy integer or an integer tensor; a float (0.3 / 0.1) is
refused by name, never truncated. Sample i is named by its number (`000042`); each read checks that
the item's label is still the one indexed, so a dataset that reordered its items stops the run
(SourceChanged), naming it, rather than train on mislabelled samples. An item of another shape (a
triple) is refused when the loader is built, naming what it is.
"""
from __future__ import annotations

import logging
import operator
import os
import time
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import SourceChanged, error_text
from ..locations import open_regular
from .protocol import Samples
from .source_reads import image_bytes

log = logging.getLogger("fastloader")

_DECODED = "a decoded image: passed to the decoders as a PPM copy of its pixels, so neither region decode nor " \
           "nvJPEG applies (a Dataset that returns the file's bytes or path keeps both)"


def from_dataset(dataset: Any, classes: Sequence[str] | None = None, name: str | None = None) -> "DatasetSource":
    """A source over a map-style Dataset of (image, label) items (module docstring)."""
    return DatasetSource(dataset, classes, name)


class DatasetSource:
    def __init__(self, dataset: Any, classes: Sequence[str] | None = None, name: str | None = None):
        if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
            raise TypeError(f"from_dataset takes a map-style Dataset (with __getitem__ and __len__), got a "
                            f"{type(dataset).__name__}")
        self.dataset = dataset
        self.name = name or f"{type(dataset).__module__}.{type(dataset).__qualname__}"
        self.classes = classes
        self.labels = np.zeros(0, dtype=np.int64)

    def samples(self) -> Samples:
        count = len(self.dataset)
        first = item_pair(self.dataset[0], 0) if count else None  # an item of another shape: refused now
        targets = getattr(self.dataset, "targets", None)
        if targets is not None and len(targets) == count:
            labels = np.asarray([class_number(label, item) for item, label in enumerate(targets)], dtype=np.int64)
        else:
            started = time.perf_counter()
            labels = np.asarray([class_number(item_pair(self.dataset[item], item)[1], item) for item in range(count)],
                                dtype=np.int64)
            log.info("%s: read each of its %d items once for its label (it has no `targets`) in %.1fs", self.name,
                     count, time.perf_counter() - started)
        self.labels = labels
        if first is not None:
            log.info("%s: its items are %s", self.name, kind_of(first[0]))
        classes = self.classes or getattr(self.dataset, "classes", None)
        if classes is None:
            classes = [str(label) for label in range(int(labels.max(initial=-1)) + 1)]
        width = len(str(max(count - 1, 0)))
        return Samples([f"{item:0{width}d}" for item in range(count)], labels, list(classes))

    def read(self, item: int) -> Any:
        image, label = item_pair(self.dataset[item], item)
        if len(self.labels) and class_number(label, item) != int(self.labels[item]):  # none before samples()
            raise SourceChanged(f"{self.name}: item {item}'s label is {class_number(label, item)} now and was "
                                f"{int(self.labels[item])} when the loader was built: the dataset changed its items "
                                f"(reordered, shuffled or replaced them), so every later read could be another "
                                f"sample under this one's label. Build a new loader (or keep the dataset's items "
                                f"in place while a loader reads it)")
        if isinstance(image, (str, os.PathLike)):
            return _file_bytes(os.fspath(image))
        return image

    def __len__(self) -> int:
        return len(self.dataset)

    def identity(self) -> str:
        own = getattr(self.dataset, "identity", None)
        return str(own()) if callable(own) else f"{self.name}:{len(self.dataset)}"


def item_pair(value: Any, item: int) -> tuple[Any, Any]:
    """(image, label) of a Dataset's item: a pair, or a dict with `image` and `label` keys (Hugging
    Face's); anything else a ValueError that says what it is and what to give."""
    if isinstance(value, Mapping):
        if "image" in value and "label" in value:
            return value["image"], value["label"]
        raise ValueError(f"item {item} is a dict with the keys {sorted(map(str, value))[:8]}; from_dataset takes "
                         f"(image, label) pairs or dicts with 'image' and 'label' keys: rename the keys (Hugging "
                         f"Face: dataset.rename_column) or wrap the dataset")
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return value[0], value[1]
    what = (f"a {type(value).__name__} of {len(value)} ({', '.join(type(part).__name__ for part in value[:4])})"
            if isinstance(value, (tuple, list)) else f"a {type(value).__name__}")
    raise ValueError(f"item {item} is {what}; from_dataset takes (image, label) pairs: wrap the dataset so that "
                     f"its items are (image, label), e.g. a Dataset whose __getitem__ returns item[:2]")


def class_number(label: Any, item: int) -> int:
    """A label as a class number: an int, a numpy integer or an integer tensor of one value; a float
    or anything else a ValueError naming the item (int() would truncate 2.9999999999999996 to 2)."""
    try:
        return operator.index(label)
    except TypeError:
        raise ValueError(f"item {item}'s label is {label!r} ({type(label).__name__}), not a class number; give each "
                         f"item its class's number, an integer") from None


def kind_of(image: Any) -> str:
    """What an item's image is and what it costs, for the build's log."""
    if isinstance(image, (str, os.PathLike)):
        return "paths of image files: read and decoded as files are (region decode, nvJPEG)"
    if isinstance(image, (bytes, bytearray, memoryview)):
        return "encoded bytes: decoded as files are (region decode, nvJPEG)"
    try:
        image_bytes(image)
    except (TypeError, ValueError) as error:
        return f"not images ({error_text(error)}): every read will fail"
    return _DECODED


def _file_bytes(path: str) -> bytearray:
    fd = open_regular(path)
    with open(fd, "rb", buffering=0) as handle:
        return bytearray(handle.read())
