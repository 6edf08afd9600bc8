"""The config schema: frozen dataclasses whose fields, defaults, range checks and docstrings are the
config reference (field order is docs/config.md's order). Loading and validation are in config.py.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from .augment.policy import GRAMMAR as POLICY_GRAMMAR
from .augment.policy import policy_problem
from .bad_input import OnBadImage
from .errors import ConfigError
from .units import UNITS, parse_size

FACTORY_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
"""`package.module:attribute`: where a user's source factory is (a split's `source`)."""
DEFAULT_ROOT_ORIGIN = "the config's folder (dataset.format: webdataset, parquet or arrow)"
"""Where dataset.root came from when a config whose splits name their files leaves it out (its origin,
in messages)."""
BACKEND_ENV = "FASTLOADER_BACKEND"
"""Environment variable that forces the backend (auto | dali | torch) whatever the config says."""
NAMED_SPLITS = ("train", "val", "test")
"""Split sections that may leave out `mode` (train: train mode, the others eval). Any other split must
state it, so that a typo such as `trian:` or `--set trian.batch_size=8` fails instead of creating a split."""

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")

INT64_MAX = 2**63 - 1
"""The largest integer a config key takes (numpy's int64, the sampler's seeds and states): a larger
one fails at load with its key, not deep inside numpy."""
MAX_BATCH = 65_536
"""The largest batch_size: a batch's buffers are allocated whole (65,536 x 3 x 224 x 224 bytes is 9.9 GB)."""
MAX_SIZE = 8192
"""The largest transform.size, in pixels."""
MAX_PROCESSES = 1024
"""The most workers, DALI threads or batches ahead a rank may ask for."""
MAX_RANKS = 1 << 20
"""The largest world size (and rank, local rank) a config may name."""
MAX_EPOCH_SIZE = 1 << 32
"""The largest epoch_size: an epoch's order is made whole, 8 bytes a position (16 while drawing), so
4,294,967,296 positions already take 32 GiB; a larger one fails at load with its key."""
MAX_CLASSES_WITHOUT_NAMES = 100_000
"""Without dataset.classes, a label of a shard member or a file list is at most this minus 1: the classes
are then 0 .. the largest label, and one stray `.cls` of 20000000 must not make 20 million classes."""

Interpolation = Literal["bilinear", "bicubic", "nearest"]
Auto = Literal["auto"]

BOMB_PIXELS = 178_956_970
"""Width x height above which a file counts as a decompression bomb. It is Pillow's own error
threshold (2 x Image.MAX_IMAGE_PIXELS): above it `Image.open` refuses the file, so the torch backend
would fail on it; such an image would also take more than 0.5 GB of RAM as RGB."""


def _check(predicate, message):
    """Field metadata: a range check whose message completes 'KEY: must be ...' (a string, or a
    function of the value for checks that can say more, such as the closest valid form)."""
    return {"check": (predicate, message)}


def _in_range(low: int, high: int):
    """The check of an integer in [low, high], and its message."""
    return _check(lambda v: low <= v <= high, f"an integer in [{low}, {high}]")


def _policy_message(value) -> str:
    reason, closest = policy_problem(value)
    return f"a policy string ({reason}); the grammar is {POLICY_GRAMMAR}; closest valid form: {closest!r}"


def _is_size(value: str) -> bool:
    try:
        return parse_size(value, "") > 0
    except ConfigError:
        return False


def _jitter_ok(value) -> bool:
    values = (value,) * 3 if isinstance(value, float) else value or ()
    return all(v >= 0 for v in values) and (len(values) < 4 or values[3] <= 0.5)


# ---------------------------------------------------------------------------------------------
# The schema. Field order is the order of the config reference (docs/config.md).
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteConfig:
    """Shards in an object store (`s3://`, `gs://`, `az://`, `https://` in a split's shards): the node cache
    and the client (docs/clusters.md#shards-in-an-object-store)."""
    cache_dir: str | None = None
    """The node cache: a folder on a local disk (NVMe) that every rank and worker of the node shares, each
    shard fetched into it once. Default: $FASTLOADER_CACHE_DIR/remote."""
    cache_limit: str | None = field(default=None, metadata=_check(
        lambda v: v is None or _is_size(v), f"a size with a unit, such as 50GB or 512MB (units: {UNITS})"))
    """The most bytes the node cache holds, with a unit (`50GB`); the least recently used shards are
    evicted past it. Default: 90% of the space free on cache_dir's disk at start, plus what the cache holds."""
    concurrency: int = field(default=8, metadata=_in_range(1, MAX_PROCESSES))
    """Shards downloaded at once, ahead of the readers, by each rank."""
    options: dict[str, str] = field(default_factory=dict, repr=False, hash=False, compare=False)
    """The client's options for this config (obstore's: `endpoint`, `region`, `skip_signature` ...),
    over the store's standard environment variables; never logged."""
    timeout: float = field(default=60.0, metadata=_check(lambda v: 0 < v < float("inf"),
                                                         "a positive number of seconds"))
    """Seconds one request may take (a shard is fetched in parts of 16 MB) before it is retried."""
    retries: int = field(default=10, metadata=_in_range(0, 100))
    """Retries of a request that failed on a 5xx, a reset connection or a timeout, with exponential backoff."""
    retry_timeout: float = field(default=90.0, metadata=_check(lambda v: 0 < v < float("inf"),
                                                                "a positive number of seconds"))
    """Seconds a request and its retries may take in all; then the run stops with an error naming the URL
    (below workers.timeout, 120 s, so that a torch worker waiting on the store is not taken for a stuck one)."""


@dataclass(frozen=True)
class DatasetConfig:
    root: str = field(metadata=_check(lambda v: v != "", "a non-empty path"))
    """Folder holding one sub-folder per split (root/<split>/<class>/<image>), or `builtin:sample`.
    With format: webdataset it may be left out (the config's folder)."""
    format: str = "folder"
    """How the images are stored: folder (image files: ImageFolder trees, or a split's file_list),
    webdataset (tar shards of {key}.jpg + {key}.cls members, listed by each split's `shards`), parquet or
    arrow (a Hugging Face dataset's `.parquet` files, or the Arrow files `datasets` keeps in its cache,
    listed by each split's `files`: an image column and a label column, one row a sample), or a format
    of your own (fastloader.sources.register_format, read with each split's source_args)."""
    classes: tuple[str, ...] | None = field(default=None, metadata=_check(
        lambda v: v is None or (len(v) > 0 and len(set(v)) == len(v) and all(v)),
        "a list of distinct, non-empty class names (or the path of a file of them, one a line)"))
    """Class names in label order, or a file of them, one a line (read when the config is loaded; `fastloader
    pack` writes `<split>-classes.txt`). Default: the sorted class folders of the split being read; for shards,
    the `<prefix>-classes.txt` beside them when there is one, else 0 .. the largest label; for parquet and
    Arrow files, their ClassLabel's names. A ClassLabel's integer labels are mapped into it by name."""
    extensions: tuple[str, ...] = IMAGE_EXTENSIONS
    """File suffixes taken as images (compared case-insensitively)."""
    exif_orientation: bool = True
    """Rotate photos as their EXIF orientation tag says, as a person viewing them would see them."""
    exclude: str | None = None
    """A text file of image paths relative to dataset.root, one per line, left out of every split
    (`fastloader check --exclude-list` writes one)."""
    on_bad_image: Literal["skip", "raise"] = "skip"
    """What a file that cannot be decoded does: skip (logged once per file, listed in
    loader.bad_samples; in train mode its batch slot refilled with a substitute drawn from the
    slot's seed, in eval mode its batch one shorter) or raise (an error naming the file)."""
    image_column: str | None = None
    """format: parquet or arrow: the column of the images (a struct of `bytes` and `path`, as Hugging Face's
    Image feature stores them, or plain binary). Default: the column the file's `huggingface` metadata calls
    an Image, else one named `image` or `img`."""
    label_column: str | None = None
    """format: parquet or arrow: the column of the labels (integers, named by the file's ClassLabel where it
    has one, else positions in dataset.classes; or class names with dataset.classes). Default: the column the
    `huggingface` metadata calls a ClassLabel, else one named `label` or `labels`."""
    screen: bool = True
    """Check every file's header when a loader is built (cached per dataset) and leave out the files
    that cannot be decoded, before a decoder sees them."""
    max_pixels: int = field(default=BOMB_PIXELS, metadata=_check(lambda v: 0 < v <= INT64_MAX,
                                                                 "a positive integer, at most 2**63 - 1"))
    """Width x height above which an image counts as a decompression bomb and is refused before
    its pixels are allocated (default: Pillow's own error threshold, BOMB_PIXELS)."""
    cache: str | None = None
    """A cache folder written by `fastloader cache`: both backends read decoded uint8 pixels from it
    through np.memmap instead of decoding the image files."""
    remote: RemoteConfig = field(default_factory=RemoteConfig)
    """Shards in an object store: the node cache and the client."""


@dataclass(frozen=True)
class ProgressiveConfig:
    """train: progressive resolution (FFCV's start_ramp / end_ramp): the output size of each epoch
    ramps linearly from min_size to the transform's size (docs/semantics.md#output-sizes)."""
    min_size: int = field(metadata=_in_range(1, MAX_SIZE))
    """The size of every epoch up to start_epoch."""
    start_epoch: int = field(metadata=_in_range(0, INT64_MAX))
    """The last epoch at min_size; the ramp starts after it."""
    end_epoch: int = field(metadata=_in_range(0, INT64_MAX))
    """The first epoch at the transform's size; every later epoch keeps it."""
    multiple: int = field(default=32, metadata=_in_range(1, MAX_SIZE))
    """Sizes on the ramp are rounded down to a multiple of this (never below min_size)."""


@dataclass(frozen=True)
class TransformConfig:
    size: int = field(default=224, metadata=_in_range(1, MAX_SIZE))
    """Output height and width in pixels (train with progressive: the size the ramp ends at)."""
    progressive: ProgressiveConfig | None = None
    """train: ramp the output size over the epochs from progressive.min_size to size (FFCV's
    ResNet recipes): {min_size, start_epoch, end_epoch, multiple (32)}. null: every epoch at size."""
    sizes: tuple[int, ...] | None = field(default=None, metadata=_check(
        lambda v: v is None or (0 < len(v) <= 64 and all(1 <= s <= MAX_SIZE for s in v)),
        f"null or a list of 1 to 64 sizes, each an integer in [1, {MAX_SIZE}]"))
    """train: one output size per batch, drawn from this list (timm's --train-img-sizes), the same on
    every rank at the same step; buffers are sized for the largest. null: every batch at size."""
    scale: tuple[float, float] = field(
        default=(0.08, 1.0), metadata=_check(lambda v: 0 < v[0] <= v[1] <= 1, "0 < min <= max <= 1"))
    """train: range of the crop's area as a fraction of the image (RandomResizedCrop)."""
    ratio: tuple[float, float] = field(
        default=(3 / 4, 4 / 3), metadata=_check(lambda v: 0 < v[0] <= v[1], "0 < min <= max"))
    """train: range of the crop's aspect ratio, width / height."""
    hflip: float = field(default=0.5, metadata=_check(lambda v: 0 <= v <= 1, "a probability in [0, 1]"))
    """train: probability of a horizontal flip."""
    vflip: float = field(default=0.0, metadata=_check(lambda v: 0 <= v <= 1, "a probability in [0, 1]"))
    """train: probability of a vertical flip."""
    auto_augment: str | None = field(default=None, metadata=_check(lambda v: v is None or not policy_problem(v)[0],
                                                                    _policy_message))
    """train: a policy of ops per sample, in timm's grammar: rand-m{M}[-n{N}][-mstd{S}][-mmax{X}][-inc{0|1}][-p{P}]
    [-t{3a|3aw|weights}] (RandAugment; t: timm's op sets), original or v0 (AutoAugment's ImageNet policies), 3a or
    three_augment (DeiT III's 3-Augment), ta_wide (TrivialAugmentWide). null: off."""
    color_jitter: float | tuple[float, float, float] | tuple[float, float, float, float] | None = field(
        default=None, metadata=_check(_jitter_ok, "brightness, contrast, saturation >= 0 and hue in [0, 0.5]"))
    """train: torchvision's ColorJitter: one strength for brightness, contrast and saturation, or
    [brightness, contrast, saturation] or with hue. Off when auto_augment is set, but for a 3a policy (as in timm)."""
    crop_pct: float = field(default=0.875, metadata=_check(lambda v: 0 < v <= 1, "in (0, 1]"))
    """eval: resize the shorter side to floor(size / crop_pct), then centre-crop size x size."""
    interpolation: Interpolation = "bilinear"
    """Resampling filter of the resize (antialiased when shrinking)."""
    erase_prob: float = field(default=0.0, metadata=_check(lambda v: 0 <= v <= 1, "a probability in [0, 1]"))
    """train: probability that an image gets random erasing (timm's RandomErasing, on the device). 0: off."""
    erase_mode: Literal["const", "rand", "pixel"] = "const"
    """train: fill of an erased box: const (zeros after normalization), rand (one normal colour per box),
    pixel (normal noise per pixel)."""
    erase_area: tuple[float, float] = field(
        default=(0.02, 1 / 3), metadata=_check(lambda v: 0 < v[0] <= v[1] < 1, "0 < min <= max < 1"))
    """train: range of the erased area as a fraction of the image, shared among the boxes of an image."""
    erase_ratio: tuple[float, float] = field(
        default=(0.3, 1 / 0.3), metadata=_check(lambda v: 0 < v[0] <= v[1], "0 < min <= max"))
    """train: range of an erased box's aspect ratio (height / width, as timm)."""
    erase_count: tuple[int, int] = field(
        default=(1, 1), metadata=_check(lambda v: 1 <= v[0] <= v[1] <= 16, "1 <= min <= max <= 16"))
    """train: range of the number of boxes erased in an image."""
    grayscale_prob: float = field(default=0.0, metadata=_check(lambda v: 0 <= v <= 1, "a probability in [0, 1]"))
    """train: probability that an image turns grey (timm's --grayscale-prob, RandomGrayscale), after the
    policy and the colour jitter. 0: off."""
    gaussian_blur_prob: float = field(default=0.0, metadata=_check(lambda v: 0 <= v <= 1,
                                                                   "a probability in [0, 1]"))
    """train: probability that an image is blurred, sigma uniform in [0.1, 2] pixels (timm's
    --gaussian-blur-prob), after grayscale_prob. 0: off."""
    color_jitter_prob: float = field(default=1.0, metadata=_check(lambda v: 0 <= v <= 1, "a probability in [0, 1]"))
    """train: probability that color_jitter applies to an image at all (torchvision's RandomApply around
    ColorJitter, as DINO's and SimCLR's recipes: 0.8). 1: always."""
    solarize_prob: float = field(default=0.0, metadata=_check(lambda v: 0 <= v <= 1, "a probability in [0, 1]"))
    """train: probability that an image is solarized, pixels >= 128 inverted (torchvision's
    RandomSolarize(128), as DINO's second global view: 0.2), after gaussian_blur_prob. 0: off."""
    sample_hook: str | None = field(default=None, metadata=_check(
        lambda v: v is None or FACTORY_PATH.fullmatch(v) is not None,
        "'package.module:function', called as function(image, generator) for each sample"))
    """Your own op on each sample (docs/transforms.md): `package.module:function`, called as
    function(image, generator) with the sample's uint8 [3, H, W] tensor after the crop, resize, flips
    and ops, and a torch.Generator seeded with the sample's seed; returns a uint8 image of that shape.
    torch backend: in the workers; DALI: through DALI's Python-function operator, on the CPU. null: none."""
    batch_hook: str | None = field(default=None, metadata=_check(
        lambda v: v is None or FACTORY_PATH.fullmatch(v) is not None,
        "'package.module:function', called as function(images, labels, seeds) for each batch"))
    """Your own op on each batch (docs/transforms.md): `package.module:function`, called as
    function(images, labels, seeds) on the loader's device after normalizing, before erasing and
    mixing, `seeds` the batch's sample seeds (int64 [B]); returns (images, labels) of the same
    shapes, dtypes and device. null: none."""


@dataclass(frozen=True)
class MixupConfig:
    """train: Mixup and CutMix of each batch on the device, with timm's Mixup semantics (docs/semantics.md)."""
    mixup_alpha: float = field(default=0.0, metadata=_check(lambda v: v >= 0, "a number >= 0 (0 turns mixup off)"))
    """Mixup's lambda ~ Beta(alpha, alpha): an image becomes lam x itself + (1 - lam) x its partner. 0: no mixup."""
    cutmix_alpha: float = field(default=0.0, metadata=_check(lambda v: v >= 0, "a number >= 0 (0 turns cutmix off)"))
    """CutMix's lambda ~ Beta(alpha, alpha): a box of about (1 - lam) of the image comes from its partner.
    0: no cutmix."""
    cutmix_minmax: tuple[float, float] | None = field(
        default=None, metadata=_check(lambda v: v is None or 0 < v[0] < v[1] <= 1, "null or 0 < min < max <= 1"))
    """CutMix's box side as a fraction of the image side, uniform in [min, max) per side, instead of
    drawn from cutmix_alpha (and cutmix is on, as timm's cutmix_alpha becomes 1). null: from the alpha."""
    prob: float = field(default=1.0, metadata=_check(lambda v: 0 <= v <= 1, "a probability in [0, 1]"))
    """Probability that a batch (mode batch) or a sample or pair (elem, pair) is mixed at all."""
    switch_prob: float = field(default=0.5, metadata=_check(lambda v: 0 <= v <= 1, "a probability in [0, 1]"))
    """With both mixup and cutmix on: the probability of cutmix rather than mixup."""
    mode: Literal["batch", "pair", "elem"] = "batch"
    """batch: one draw for the whole batch. pair: one per pair (i, B-1-i). elem: one per sample."""
    correct_lam: bool = True
    """CutMix: lam becomes 1 - the box's area / the image's once the box is clipped to the image."""


@dataclass(frozen=True)
class SourceConfig:
    """One source of a split's `sources`: a folder tree, a file list, tar shards or parquet/Arrow files,
    with its weight and its class mapping (docs/semantics.md, several sources)."""
    folder: str | None = None
    """A folder of class folders (<folder>/<class>/<image>), relative to dataset.root or absolute."""
    file_list: str | None = None
    """A text file of `relative/path label` lines (the label an integer or a class name), the paths
    relative to dataset.root."""
    shards: str | tuple[str, ...] | None = None
    """Tar shards: a path, glob or brace range, or a list of them (relative as the split's shards)."""
    files: str | tuple[str, ...] | None = None
    """Parquet or Arrow files of a Hugging Face dataset (as a split's `files` under dataset.format: parquet
    or arrow): a path, glob or brace range, or a list of them, relative as shards are."""
    format: Literal["parquet", "arrow"] | None = None
    """With `files`: parquet or arrow. Unset: arrow where every pattern ends in `.arrow`, else parquet."""
    source: str | None = field(default=None, metadata=_check(
        lambda v: v is None or FACTORY_PATH.fullmatch(v) is not None,
        "'package.module:factory', a callable that returns a source (fastloader.Source)"))
    """Your own source among the split's: `package.module:factory`, called with this source's source_args.
    Its samples join the others' through the Source protocol, named `<name>/<its name>` (docs/sources.md)."""
    source_args: Mapping[str, Any] | None = None
    """The keyword arguments of this source's `source` factory (plain YAML values)."""
    weight: float | None = field(default=None, metadata=_check(lambda v: v is None or v >= 0, "a number >= 0"))
    """train: the source's share of each epoch's draws, against the other sources' weights (set on every
    source or on none). Unset: the sources are one split, each sample once an epoch."""
    classes: Literal["shared", "own"] = "shared"
    """shared: its class names are the split's (a name the others lack is appended). own: its classes
    are appended after the others', named `<name>/<class>`."""
    name: str | None = field(default=None, metadata=_check(lambda v: v is None or (v != "" and "/" not in v),
                                                           "a non-empty name without '/'"))
    """What logs and own class names call it. Default: source<k>, k its place in the list from 0."""


SOURCE_KINDS = ("folder", "file_list", "shards", "files")
"""The keys of a split that say where its samples are, and so a split with `sources` has none of them."""
ENTRY_KINDS = (*SOURCE_KINDS, "source")
"""The keys of one of a split's `sources` that say where its samples are: exactly one of them."""
MAX_SOURCES = 1024
"""The most sources a split may list (a sample's source is an int16)."""
DRAW_KEYS = ("weights", "class_weights", "epoch_size")
"""Split keys that make a train order of draws: eval splits read every sample once and refuse them."""


TRAIN_TRANSFORM_KEYS = ("size", "progressive", "sizes", "scale", "ratio", "hflip", "vflip", "auto_augment",
                        "color_jitter", "interpolation", "erase_prob", "erase_mode", "erase_area", "erase_ratio",
                        "erase_count", "grayscale_prob", "gaussian_blur_prob", "color_jitter_prob", "solarize_prob",
                        "sample_hook", "batch_hook")
VIEW_TRANSFORM_KEYS = tuple(key for key in TRAIN_TRANSFORM_KEYS
                            if key not in ("progressive", "sizes", "sample_hook", "batch_hook"))
"""The transform keys a view group may set for its views (the size schedules and the hooks are the split's)."""
MAX_VIEWS = 64
"""The most views of a sample a train split's `views` may ask for, all groups together."""
EVAL_TRANSFORM_KEYS = ("size", "crop_pct", "interpolation", "sample_hook", "batch_hook")
TRAIN_SPLIT_KEYS = ("aug_repeats", "label_smoothing", "mixup", "batch_sizes")
"""Split keys that only train mode takes: eval batches are never repeated, mixed or smoothed, nor
of several sizes."""


@dataclass(frozen=True)
class ViewConfig:
    """One group of a train split's `views` (docs/views.md): `count` crops of each sample, each with
    draws of its own, through the split's transform with the group's own keys over it."""
    count: int = field(default=1, metadata=_in_range(1, MAX_VIEWS))
    """Views of each sample in this group: its tensor is [count * batch, 3, size, size], crop-major."""
    name: str | None = field(default=None, metadata=_check(lambda v: v is None or (v != "" and v.isprintable()),
                                                           "a non-empty name"))
    """What logs, `fastloader show` and describe() call the group. Default: view<k>, k its place from 0."""
    transform: TransformConfig = TransformConfig()
    """The group's transform: the split's, with the group's own keys (VIEW_TRANSFORM_KEYS) over it."""


@dataclass(frozen=True)
class HeldOutConfig:
    """A split made of samples held out of another split (docs/config.md#a-split-held-out-of-another):
    class by class, a seeded choice of the other split's samples, which that split then leaves out."""
    of: str
    """The split whose samples are held out (train): it reads the rest, this split the held-out ones."""
    fraction: float | None = field(default=None, metadata=_check(lambda v: v is None or 0 < v < 1,
                                                                 "a fraction in (0, 1), or null"))
    """This share of each class, rounded (at least one sample of a class of two or more)."""
    count: int | None = field(default=None, metadata=_check(lambda v: v is None or 1 <= v <= MAX_EPOCH_SIZE,
                                                            f"an integer in [1, {MAX_EPOCH_SIZE}], or null"))
    """This many samples of each class (fraction or count, not both)."""
    seed: int | None = field(default=None, metadata=_check(lambda v: v is None or 0 <= v <= INT64_MAX,
                                                           "an integer in [0, 2**63 - 1], or null"))
    """Seeds the choice. null: the config's seed."""


@dataclass(frozen=True)
class SplitConfig:
    name: str
    mode: Literal["train", "eval"]
    """train: random-resized-crop + flip, every rank the same number of batches.
    eval: resize + centre crop, every sample exactly once across ranks.
    Default: train for a split named `train`, eval for any other."""
    batch_size: int = field(default=64, metadata=_in_range(1, MAX_BATCH))
    """Samples per batch on each rank (with batch_sizes: the largest of them)."""
    batch_sizes: tuple[int, ...] | None = field(default=None, metadata=_check(
        lambda v: v is None or (0 < len(v) <= 64 and all(1 <= b <= MAX_BATCH for b in v)),
        f"null or a list of 1 to 64 batch sizes, each an integer in [1, {MAX_BATCH}]"))
    """train with transform.sizes: one batch size per size, in the same order (timm's
    batch_size_choices: [256, 160, 128] with sizes [160, 192, 224] keeps a step's memory); each step
    takes a pair, all ranks alike, an epoch as many steps of each pair (docs/semantics.md#output-sizes).
    null: every batch of batch_size."""
    shuffle: bool | Literal["block"] = True
    """A new seeded permutation every epoch. Default: true in train mode, false in eval mode.
    block: tar shards shuffled and read block by block (at most block_size bytes of shards a block), the
    samples shuffled within each block: a cache of two blocks then fetches each shard once per epoch."""
    drop_last: bool = True
    """train mode: drop the incomplete last batch (true) or pad ranks to equal length (false).
    Must be false in eval mode. Default: true in train mode."""
    block_size: str | None = field(default=None, metadata=_check(
        lambda v: v is None or _is_size(v), f"a size with its unit, such as 4GB or 512MB; {UNITS}"))
    """shuffle: block: the most bytes of shards a block holds, with a unit (4GB, 512MB). Default: half of
    the node cache's limit where the shards are remote (the next block is fetched while one trains)."""
    folder: str | None = None
    """Sub-folder of dataset.root holding this split. Default: the split's name."""
    file_list: str | None = None
    """A text file of `relative/path label` lines to read instead of scanning folders (the label an
    integer or a class name; each path normalized, one relative to dataset.root where it is under it;
    a file named twice is refused)."""
    shards: str | tuple[str, ...] | None = None
    """dataset.format: webdataset: the split's tar shards: a path, glob or brace range
    (`train-{000000..000146}.tar`), or a list of them, relative to dataset.root when it is set, else to
    the config file's folder; or objects in a store (`s3://`, `gs://`, `az://`, `https://`: dataset.remote)."""
    files: str | tuple[str, ...] | None = None
    """dataset.format: parquet or arrow: the split's `.parquet` (or `.arrow`) files: a path, glob or brace
    range, or a list of them, relative as `shards` are; parquet files may be objects in a store (dataset.remote)."""
    source: str | None = field(default=None, metadata=_check(
        lambda v: v is None or FACTORY_PATH.fullmatch(v) is not None,
        "'package.module:factory', a callable that returns a source (fastloader.Source)"))
    """Your own source: `package.module:factory`, called with source_args, returns an object of the
    Source protocol (name, samples(), read(item), identity(); docs/sources.md). Instead of folder,
    file_list, shards, files or sources."""
    source_args: Mapping[str, Any] | None = None
    """The keyword arguments of `source`'s factory (plain YAML values), or of the split's format where
    dataset.format names a format of your own (fastloader.sources.register_format)."""
    sources: tuple[SourceConfig, ...] | None = field(default=None, metadata=_check(
        lambda v: v is None or 1 <= len(v) <= MAX_SOURCES, f"a list of 1 to {MAX_SOURCES} sources"))
    """Several sources in one split, instead of folder / file_list / shards: each a folder, file_list or
    shards, with its weight (the share of each epoch's draws) and its classes (shared or own)."""
    held_out: HeldOutConfig | None = None
    """The split's samples held out of another split, class by class (instead of folder, file_list,
    shards, files, source or sources): `val: {held_out: {of: train, fraction: 0.1}}`. null: none."""
    weights: str | None = None
    """train: a text file of `name weight` lines (names as `fastloader check` and dataset.exclude write
    them, one line per sample): samples are drawn with replacement in proportion to their weights."""
    class_weights: Literal["inverse", "sqrt"] | Mapping[str, float] | None = field(default=None, metadata=_check(
        lambda v: not isinstance(v, Mapping) or (len(v) > 0 and all(w >= 0 for w in v.values())),
        "inverse, sqrt, or a mapping of class names to weights >= 0"))
    """train: each sample weighs 1 / its class's size (inverse: classes drawn equally often), 1 / sqrt
    of it (sqrt), or its class's weight in a {class: weight} mapping (classes left out weigh 1)."""
    epoch_size: int | None = field(default=None, metadata=_check(lambda v: v is None or 1 <= v <= MAX_EPOCH_SIZE,
                                                                 f"an integer in [1, {MAX_EPOCH_SIZE}]"))
    """train: positions of each epoch's order. Default: the split's size. Without weights, consecutive
    shuffled passes over the split cut to this size; with them, this many weighted draws."""
    aug_repeats: int = field(default=1, metadata=_check(lambda v: 1 <= v <= MAX_PROCESSES,
                                                        f"an integer in [1, {MAX_PROCESSES}] (1: no repeats)"))
    """train: repeated augmentation (DeiT's RASampler): each sample chosen K times in a row of the
    epoch's order, each copy with its own augmentation seed; the epoch keeps its length. 1: off."""
    label_smoothing: float = field(default=0.0, metadata=_check(lambda v: 0 <= v < 1, "in [0, 1)"))
    """train: labels become soft targets [B, num_classes]: 1 - smoothing + smoothing / C on the label,
    smoothing / C elsewhere (timm's mixup_target). 0: off (int64 labels unless mixup is on)."""
    views: tuple[ViewConfig, ...] | None = None
    """train: several views of each sample (multi-crop, DINO's), decoded once: a list of groups, each
    {count, name, and any train transform key over the split's: size, scale, ratio, flips, ops, blur,
    solarize, erasing, interpolation}; `images` becomes a list with one [count * B, 3, size, size]
    tensor per group, crop-major: view k of sample i at row k * B + i (docs/views.md). null: one crop per sample."""
    view_ops: Literal["auto", "stacked", "per_view"] = "auto"
    """train, with views: how a view group's ops run. stacked: the group's views through each op together
    (torch: a batch's views of the group at once, in the collate; DALI: a sample's views as the frames of
    one sequence); per_view: each view's ops on their own (torch: in the sample's call; DALI: a branch per
    view). auto: stacked on torch, per view on DALI (docs/views.md says why). torch gives the same pixels
    either way, and keeps the ops per view where a sample hook takes the finished views."""
    transform: TransformConfig = TransformConfig()
    mixup: MixupConfig = MixupConfig()


@dataclass(frozen=True)
class NormalizeConfig:
    mean: tuple[float, float, float] = field(
        default=IMAGENET_MEAN, metadata=_check(lambda v: all(0 <= x <= 1 for x in v), "in 0..1 units (pixel / 255)"))
    """Per-channel (R, G, B) mean subtracted, in 0..1 units."""
    std: tuple[float, float, float] = field(
        default=IMAGENET_STD, metadata=_check(lambda v: all(0 < x <= 1 for x in v), "in (0, 1] (pixel / 255)"))
    """Per-channel (R, G, B) standard deviation divided by, in 0..1 units."""


@dataclass(frozen=True)
class OutputConfig:
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    """dtype of the image batches."""
    channels_last: bool = False
    """Memory format of the image batches: channels_last (NHWC in memory) or contiguous NCHW."""
    device: str = field(default="auto", metadata=_check(
        lambda v: v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isascii() and v[5:].isdigit()),
        "auto, cpu, cuda or cuda:N (N a GPU index, e.g. cuda:1)"))
    """auto: the local rank's GPU when CUDA is available (cuda:LOCAL_RANK, or cuda:0 where each rank
    sees only its own), else cpu. cuda: that GPU. cuda:N: GPU N whatever the local rank (checked
    against the GPUs torch sees when a loader is built)."""


@dataclass(frozen=True)
class WorkersConfig:
    num_workers: int | Auto = field(
        default="auto", metadata=_check(lambda v: v == "auto" or 0 <= v <= MAX_PROCESSES,
                                        f"'auto' or an integer in [0, {MAX_PROCESSES}]"))
    """Decoding processes per rank. auto: the CPU cores available to this local rank, capped by max_workers."""
    max_workers: int = field(default=16, metadata=_in_range(1, MAX_PROCESSES))
    """Cap on num_workers: auto."""
    prefetch_factor: int = field(default=2, metadata=_in_range(1, MAX_PROCESSES))
    """Batches each worker prepares ahead."""
    persistent: bool = True
    """Keep workers alive between epochs (no restart cost at each epoch boundary)."""
    pin_memory: bool | Auto = "auto"
    """Pin host batches for asynchronous copies. auto: when the output device is CUDA."""
    timeout: float = field(default=120.0, metadata=_check(lambda v: 0 < v < float("inf"),
                                                          "a positive number of seconds"))
    """torch backend: seconds a batch may take before the loader names the worker that does not answer
    (stopped, or alive but silent) and stops; the first batch after the workers start may take 3x that."""


MAX_FEED_PROCESSES = 32
"""More processes than this reading one rank's feed is a typo (each reads a share of a batch)."""


@dataclass(frozen=True)
class DaliConfig:
    hw_decoder_load: float = field(default=0.65, metadata=_check(lambda v: 0 <= v <= 1, "a fraction in [0, 1]"))
    """GPU flavour: share of each batch sent to the GPU's hardware JPEG decoder where it has one (A100,
    H100, H200); the rest goes to nvJPEG's CUDA decoder. 0.65 is NVIDIA's ResNet-50 example value."""
    fancy_upsampling: bool | Auto = "auto"
    """GPU flavour: how nvJPEG upsamples JPEG chroma (4:2:0, 4:2:2). auto: by interpolation, as libjpeg-turbo
    does (the CPU flavour's and the torch backend's pixels), wherever the installed nvJPEG does it on the GPU:
    whole images always, a train crop's region from nvJPEG 13.2 (nvidia-dali-cuda130); with an older nvJPEG,
    train regions repeat each chroma pixel (within docs/semantics.md's bound) rather than go to the CPU
    decoder. true: interpolated always; with an older nvJPEG, train decodes whole images and takes the crop
    in the resize. false: repeated always (nvJPEG's default, NVIDIA's ResNet-50 example). The CPU flavour
    always interpolates. The build's log says which and why (docs/performance.md#the-cuda-stack)."""
    threads: int | Auto = field(default="auto", metadata=_check(lambda v: v == "auto" or 1 <= v <= MAX_PROCESSES,
                                                                 f"'auto' or an integer in [1, {MAX_PROCESSES}]"))
    """DALI's CPU threads per rank. auto: workers.num_workers when set, else the CPU cores available to this
    local rank, capped by workers.max_workers."""
    feed_processes: int | Auto = field(default="auto", metadata=_check(
        lambda v: v == "auto" or 0 <= v <= MAX_FEED_PROCESSES, f"'auto' or an integer in [0, {MAX_FEED_PROCESSES}]"))
    """Worker processes that read and check the files of the next batches while DALI decodes, into
    shared memory DALI reads in place (docs/performance.md); 0: the feed reads them on the driver
    thread. auto: 0 in the CPU flavour (DALI's threads already take every core), else a quarter of
    the rank's cores (dali.threads' count), at most 4."""
    graph_hook: str | None = field(default=None, metadata=_check(
        lambda v: v is None or FACTORY_PATH.fullmatch(v) is not None,
        "'package.module:function', called as function(images, seeds, **graph_hook_args) while the graph is built"))
    """Your own DALI operators (docs/transforms.md): `package.module:function`, called once while the
    graph is built as function(images, seeds, **graph_hook_args), with the DataNode of the uint8 HWC
    images after the crop, resize, flips and ops (on the GPU in the GPU flavour) and the DataNode of
    the samples' seeds (int64, CPU); returns the images' DataNode, of the same size. DALI backend
    only: a torch loader refuses it. null: none."""
    graph_hook_args: Mapping[str, Any] | None = None
    """Keyword arguments of graph_hook (plain YAML values)."""


@dataclass(frozen=True)
class DistributedConfig:
    rank: int | Auto = field(default="auto", metadata=_check(lambda v: v == "auto" or 0 <= v < MAX_RANKS,
                                                             f"'auto' or an integer in [0, {MAX_RANKS - 1}]"))
    """This process's rank. auto: torch.distributed, else torchrun's RANK, else SLURM_PROCID, else 0."""
    world_size: int | Auto = field(default="auto", metadata=_check(lambda v: v == "auto" or 0 < v <= MAX_RANKS,
                                                                   f"'auto' or an integer in [1, {MAX_RANKS}]"))
    """Number of ranks. auto: torch.distributed, else WORLD_SIZE, else SLURM_NTASKS, else 1."""
    local_rank: int | Auto = field(default="auto", metadata=_check(lambda v: v == "auto" or 0 <= v < MAX_RANKS,
                                                                   f"'auto' or an integer in [0, {MAX_RANKS - 1}]"))
    """Rank on this node; picks the GPU (cuda:LOCAL_RANK where a rank sees all of the node's GPUs).
    auto: LOCAL_RANK, else SLURM_LOCALID, else 0."""

    def given(self) -> tuple[int | Auto, int | Auto, int | Auto]:
        """(rank, world_size, local_rank) as distributed.detect_ranks takes them."""
        return self.rank, self.world_size, self.local_rank


@dataclass(frozen=True)
class StatsConfig:
    log_level: Literal["debug", "info", "warning", "none"] = "info"
    """Level of the end-of-epoch line that says how long the trainer waited for data (none: no line)."""


@dataclass(frozen=True)
class TunedConfig:
    """Settings `fastloader tune` measured on this kind of machine (docs/config.md#tuned-settings)."""
    file: str | None = None
    """A file `fastloader tune` wrote: its settings (backend, workers, DALI threads ...; never a key that
    changes what is delivered) apply over the config's, an override over them. `tuned: FILE` is short for it."""
    measured_on: Mapping[str, Any] | None = None
    """What the settings were measured on (cores, ranks per node, GPU, torch and DALI versions, data format),
    as the tuned file says; build_loader warns where it differs from the machine it runs on."""


@dataclass(frozen=True)
class Config:
    dataset: DatasetConfig
    backend: Literal["auto", "dali", "torch"] = "auto"
    """auto: DALI when it imports and a GPU is present, else torch. Forced by $FASTLOADER_BACKEND."""
    seed: int = field(default=0, metadata=_check(lambda v: 0 <= v <= INT64_MAX, "an integer in [0, 2**63 - 1]"))
    """Seeds the epoch permutations and every random augmentation."""
    normalize: NormalizeConfig = NormalizeConfig()
    output: OutputConfig = OutputConfig()
    workers: WorkersConfig = WorkersConfig()
    dali: DaliConfig = DaliConfig()
    distributed: DistributedConfig = DistributedConfig()
    stats: StatsConfig = StatsConfig()
    tuned: TunedConfig = TunedConfig()
    splits: Mapping[str, SplitConfig] = field(default_factory=dict)
    """One top-level section per split, named after it (train, val, ...)."""
    source: str = "<dict>"
    """Where the config came from, for messages."""
    origins: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Dotted key -> what set it when not the file: "override 'KEY'", a command's option, the
    environment variable, or the default (top-level scalars only)."""

    def origin(self, key: str) -> str:
        """Where this key's value really came from, for logs: an override, the command, the
        environment, the default, or the config file."""
        return self.origins.get(key) or self.source

    @property
    def on_bad_image(self) -> OnBadImage:
        """dataset.on_bad_image as the value the indexers, screening and the caches apply."""
        return OnBadImage(self.dataset.on_bad_image, self.source)

    def hook_settings(self, split: SplitConfig) -> dict[str, tuple[str | None, str, str]]:
        """The split's hooks as hooks.split_hooks takes them: {kind: (the configured
        'package.module:function' or None, its key, where it was set)}."""
        keys = {"sample_hook": (split.transform.sample_hook, f"{split.name}.transform.sample_hook"),
                "batch_hook": (split.transform.batch_hook, f"{split.name}.transform.batch_hook"),
                "graph_hook": (self.dali.graph_hook, "dali.graph_hook")}
        return {kind: (path, key, self.origin(key)) for kind, (path, key) in keys.items()}

    def split(self, name: str) -> SplitConfig:
        """The named split's section, or an error listing the splits that exist."""
        if name in self.splits:
            return self.splits[name]
        if not isinstance(name, str):
            splits = ", ".join(sorted(self.splits)) or "none"
            raise ConfigError(f"{self.source}: split {name!r} is no split name (a {type(name).__name__}); name the "
                              f"split, one of {splits} (build_loader(config, 'train'))")
        known = ", ".join(sorted(self.splits)) or "none"
        alike = [split for split in self.splits if name.lower().startswith(split) or split.startswith(name.lower())]
        hint = alike[:1] or difflib.get_close_matches(name, list(self.splits), n=1, cutoff=0.5)
        suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
        mode = "" if name in NAMED_SPLITS else "mode: eval, "  # other splits must state their mode
        raise ConfigError(
            f"{self.source}: no split '{name}' (splits defined: {known}){suggestion} "
            f"Add a top-level '{name}:' section, e.g. '{name}: {{{mode}batch_size: 64}}'"
            f"{' (or mode: train)' if mode else ''}.")


SECTIONS = {"dataset": DatasetConfig, "normalize": NormalizeConfig, "output": OutputConfig,
            "workers": WorkersConfig, "dali": DaliConfig, "distributed": DistributedConfig, "stats": StatsConfig,
            "tuned": TunedConfig}
"""Top-level key -> the dataclass of its section."""
SCALARS = ("backend", "seed")
"""Top-level keys that hold a value, not a section."""


def draws_from(split: SplitConfig) -> list[str]:
    """The keys of a split that weigh its samples (empty: its order is a permutation, or passes)."""
    keys = [f"{split.name}.{key}" for key in ("weights", "class_weights") if getattr(split, key) is not None]
    if split.sources is not None and any(source.weight is not None for source in split.sources):
        keys.append(f"{split.name}.sources[].weight")
    return keys
