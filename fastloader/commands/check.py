"""`fastloader check`: the environment, a summary of every split, and the files a loader would fail on.

Why before training: a run should not die hours in on one truncated JPEG, nor train on a class that
holds a tenth of the images of the others without anyone noticing. The header check reads a few KB
per file (fast enough for ImageNet in minutes); `--deep` decodes every file. `--exclude-list` writes
the bad files to a list that `dataset.exclude` leaves out of every split.

The module imports only the standard library (and fastloader.words, which does too) at its top: the
command line imports every command module to build its parser.
"""
from __future__ import annotations

import collections
import dataclasses
import importlib
import importlib.util
import os
import platform
import statistics
import time
from array import array
from typing import TYPE_CHECKING, Sequence

from ..words import plural

if TYPE_CHECKING:
    from ..decoding.screen import Screened
    from ..schema import Config, SplitConfig

HELP = "report the environment, summarize the dataset and find unreadable files"
EXAMPLES = """  fastloader check configs/sample.yaml
  fastloader check configs/imagenette.yaml --set dataset.root=/data/imagenette2-320 --deep
  fastloader check configs/imagenette.yaml --exclude-list bad-files.txt
"""

FOUND_PROBLEMS = 1
"""The exit status when some files cannot be read: a finding, as a linter's 1, not an error."""
FINDINGS = {FOUND_PROBLEMS: "some files cannot be read (listed; --exclude-list FILE writes them for "
                            "dataset.exclude), or a package the loaders need does not import"}
"""Exit statuses of results, for the help (the rule for the others: fastloader/cli.py)."""
LISTED = 20
"""Problem files printed before '... and N more' (the exclude list holds them all)."""
HW_JPEG_DECODER = {(8, 0): "A100, A30", (9, 0): "H100, H200", (10, 0): "B200"}
"""Compute capabilities whose GPUs have NVIDIA's hardware JPEG decoder (NVJPG), which DALI uses."""
MANY_CLASSES = 10
"""Above this, images per class are summarized (min, median, max, smallest) rather than listed."""


def add_arguments(parser) -> None:
    parser.add_argument("--deep", action="store_true",
                        help="also decode every file fully (catches corrupt image data; at decode speed)")
    parser.add_argument("--exclude-list", metavar="PATH",
                        help="write the problem files (relative to dataset.root) to PATH, for dataset.exclude")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="processes that check files (default: the CPU cores available)")


def run(args) -> int:
    from ..config import load_config
    from ..decoding.screen import quiet_pillow
    from ..errors import ConfigError
    from ..sources.folder import dataset_root

    config = load_config(args.config, args.overrides)
    if not config.splits:
        raise ConfigError(f"{config.source}: no split sections to check; add one, e.g. 'train: {{}}'")
    if args.workers is not None and args.workers < 0:
        raise ConfigError(f"--workers: must be 0 or more, got {args.workers}")
    if args.exclude_list:  # refused before the check, which may take minutes, not after it
        _check_exclude_list_path(args.exclude_list)
    quiet_pillow()
    print_environment()
    root = dataset_root(config)
    excluded = _read_excluded(config, root)
    problems: dict[str, Screened] = {}
    checked, split_problems = 0, 0
    for split in config.splits.values():
        print()
        tally = check_split(config, split, root, args.deep, args.workers)
        checked += tally.files
        split_problems += len(tally.split_problems)
        for screened in tally.problems:
            problems.setdefault(os.path.relpath(screened.path, root), screened)
    print()
    report_problems(problems, checked, args.deep)
    if args.exclude_list:
        write_exclude_list(args.exclude_list, problems, excluded, config.dataset.exclude)
    elif problems:
        print("to leave them out of every split: run again with --exclude-list FILE, and set dataset.exclude "
              "to that FILE")
    broken = environment_problems()
    for line in broken:
        print(f"problem: {line}")
    return FOUND_PROBLEMS if problems or broken or split_problems else 0


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------


def print_environment() -> None:
    print("versions: " + ", ".join(versions()))
    devices = cuda_devices()
    for backend, line in decoders(bool(devices)).items():
        print(f"decoders, {backend} backend: {line}")
    for line in nvjpeg_lines():
        print(line)
    if not devices:
        print("CUDA devices: none (the dali backend would run its CPU flavour, the torch backend decodes on the CPU)")
        return
    print(f"CUDA devices: {len(devices)}")
    for line in devices:
        print(f"  {line}")


def versions() -> list[str]:
    """Python, torch, torchvision, DALI and Pillow, each with what went wrong if it does not import."""
    from PIL import __version__ as pillow
    from PIL import features
    found = [f"Python {platform.python_version()}"]
    for label, module in (("torch", "torch"), ("torchvision", "torchvision"), ("DALI", "nvidia.dali")):
        found.append(f"{label} {_module_version(module)}")
    turbo = features.check_feature("libjpeg_turbo")
    found.append(f"Pillow {pillow} ({'with' if turbo else 'without'} libjpeg-turbo"
                 f"{'' if turbo else ': JPEG decoding on the torch backend is slower'})")
    return found


PACKAGES = {"torch": ("torch", "torch"), "torchvision": ("torchvision", "torchvision"),
            "nvidia.dali": ("DALI", None)}
"""Module -> (its name in messages, the pip package that installs it; DALI's: _dali_package)."""
REQUIRED = ("torch", "torchvision")
"""Modules the loaders need: torch always, torchvision for the uint8 cache's resize and for
interpolations torch has no uint8 kernel for (DALI is optional: the torch backend serves without it)."""


def environment_problems() -> list[str]:
    """A package the loaders need that is missing, or one that is installed and does not import (a
    broken install, a library of the wrong version, a folder that shadows it), or a driver too old
    for torch's or DALI's CUDA: each with the fix."""
    found = []
    for module, (label, package) in PACKAGES.items():
        version = _module_version(module)
        if version.startswith("does not import") or (version == "not installed" and module in REQUIRED):
            try:
                spec = importlib.util.find_spec(module)
            except Exception:  # a parent package that does not import either
                spec = None
            where = f" at {os.path.dirname(spec.origin)}" if spec is not None and spec.origin else ""
            package = package or _dali_package()
            fix = f"install it (pip install {package})" if version == "not installed" else \
                f"reinstall it (pip install --force-reinstall {package}), or remove what shadows it on sys.path"
            found.append(f"{label}{where} {version}: {fix}")
    from ..cuda_install import (
        dali_cuda_major_installed,
        driver_cuda_version,
        driver_gpu_count,
        driver_problem,
        torch_cuda_major,
    )
    if driver_gpu_count():  # a GPU the driver sees, that torch and DALI may not run on
        try:
            builds = {"torch": torch_cuda_major(), "DALI": dali_cuda_major_installed()}
        except Exception:  # noqa: BLE001 - torch itself broken: reported above
            builds = {"DALI": dali_cuda_major_installed()}
        problem = driver_problem(driver_cuda_version(), builds)
        if problem:
            found.append(problem)
    return found


def _dali_package() -> str:
    """The DALI wheel of torch's CUDA (factory.dali_package); PyPI torch's where torch does not import."""
    try:
        from ..factory import dali_package
        return dali_package()
    except Exception:  # noqa: BLE001 - torch itself broken: that is reported on its own line
        return "nvidia-dali-cuda130"


def decoders(cuda: bool) -> dict[str, str]:
    """Which decoder each backend would use here: the torch backend's from its own choice (region
    decode with nvImageCodec where it is installed), DALI's from whether there is a GPU."""
    try:
        from ..decoding.decode import describe
        torch_line = describe()
    except Exception as error:  # FASTLOADER_JPEG_DECODER set wrong, or a decoder that fails to load
        torch_line = f"cannot tell ({type(error).__name__}: {error})"
    dali = _module_version("nvidia.dali")
    if dali == "not installed" or dali.startswith("does not import"):
        dali_line = f"none (DALI {dali})"
    elif cuda:
        dali_line = "nvJPEG on the GPU, with the hardware JPEG decoder where the GPU has one (below); train " \
                    "crops decode only their region"
    else:
        dali_line = "its CPU flavour (libjpeg-turbo); train crops decode only their region"
    return {"torch": torch_line, "dali": dali_line}


def nvjpeg_lines() -> list[str]:
    """Which nvJPEG DALI's decoders bind (version and file), and the copy torchvision bundles, which
    they bind instead in a script that imports torchvision before fastloader; a CUDA 12 install's
    leftovers (fastloader.cuda_libraries). Nothing where DALI is not installed."""
    from ..cuda_install import cuda12_leftovers, dali_cuda_major_installed
    from ..cuda_libraries import ROI_FANCY_NVJPEG, bound_nvjpeg, file_version, torchvision_nvjpeg
    major = dali_cuda_major_installed()
    if major is None:
        return []
    lines = []
    bound = bound_nvjpeg(major)  # `import fastloader` bound the wheel's, where one is installed
    if bound is None:
        lines.append(f"nvJPEG, dali backend: none loads as libnvjpeg.so.{major}: DALI's GPU decoders cannot start; "
                     f"pip install 'nvidia-nvjpeg>=13.2' (docs/install.md)")
    else:
        words = ".".join(map(str, bound.version)) if bound.version else "of unknown version"
        regions = "" if bound.version and bound.version[:2] >= ROI_FANCY_NVJPEG else \
            " (below 13.2: train's regions repeat chroma on the GPU; pip install 'nvidia-nvjpeg>=13.2')"
        lines.append(f"nvJPEG, dali backend: DALI's decoders bind nvJPEG {words} ({bound.path}){regions}")
    bundled = torchvision_nvjpeg(major)
    if bundled and bound is not None and bundled != bound.path:
        version = file_version(bundled)
        words = ".".join(map(str, version)) if version else "of unknown version"
        lines.append(f"  torchvision bundles nvJPEG {words} ({bundled}) under the same soname: a script that "
                     f"imports torchvision before fastloader makes DALI's decoders bind that one; import fastloader "
                     f"first (docs/install.md#which-nvjpeg-dali-binds)")
    lines += [f"warning: {leftover}" for leftover in cuda12_leftovers()]
    return lines


def _module_version(name: str) -> str:
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        if error.name and name.startswith(error.name):
            return "not installed"
        return f"does not import ({error})"
    except Exception as error:  # an installed package that fails to load (missing library, ABI)
        return f"does not import ({type(error).__name__}: {error})"
    return getattr(module, "__version__", "(version unknown)")


def cuda_devices() -> list[str]:
    """One line per CUDA device: name, memory, and whether it has a hardware JPEG decoder."""
    import torch
    if not torch.cuda.is_available():
        return []
    lines = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        capability = (props.major, props.minor)
        models = HW_JPEG_DECODER.get(capability)
        decoder = (f"yes, like the {models}" if models else "no") + \
            f" (judged from compute capability {props.major}.{props.minor})"
        lines.append(f"cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB, hardware JPEG decoder: {decoder}")
    return lines


# ---------------------------------------------------------------------------------------------
# Splits
# ---------------------------------------------------------------------------------------------


class Tally:
    """What a split's screening adds up to, kept small for a million files: counts, the sizes in two
    int arrays, and only the odd files as objects."""

    def __init__(self) -> None:
        self.files = 0
        self.formats: collections.Counter[str] = collections.Counter()
        self.widths, self.heights = array("q"), array("q")
        self.mislabelled: list[Screened] = []
        self.problems: list[Screened] = []
        self.warned: list[Screened] = []
        """Files that decode with a decoder's warning (--deep): damage concealed, said, not left out."""
        self.split_problems: list[str] = []
        """What the split's keys make of its size (no whole batch), as a problem line."""

    def add(self, screened: Screened) -> None:
        self.files += 1
        self.formats[screened.format or "unknown"] += 1
        if screened.width is not None and screened.height is not None:
            self.widths.append(screened.width)
            self.heights.append(screened.height)
        if screened.suffix_mismatch:
            self.mislabelled.append(screened)
        if screened.problem:
            self.problems.append(screened)
        elif screened.warning:
            self.warned.append(screened)


def check_split(config: Config, split: SplitConfig, root: str, deep: bool, workers: int | None) -> Tally:
    """Index the split, screen its files with a progress line, print its summary."""
    from ..decoding.screen import Screened, screen_files
    from ..progress import Progress
    from ..sources.formats import build_index

    # every problem is reported here, none raised: what indexing leaves out (shard members) too
    reporting = dataclasses.replace(config, dataset=dataclasses.replace(config.dataset, on_bad_image="skip"))
    index = build_index(reporting, split)
    progress = Progress(len(index), unit="files")
    tally = Tally()
    for name, reason in index.unusable:
        tally.add(Screened(name, problem=reason))
    started = time.perf_counter()
    locations = (index.location(i) for i in range(len(index)))
    from ..decoding.decode import decoded_with_words
    for screened in screen_files(locations, deep=decoded_with_words if deep else False, workers=workers,
                                 on_progress=progress.update):
        tally.add(screened)
    progress.finish()
    elapsed = time.perf_counter() - started
    where = (f"{_count(len(split.sources), 'source')} in {index.root}" if split.sources is not None else
             f"file list {split.file_list}" if split.file_list else
             f"{_count(len(index.ranges.files), 'shard')} in {index.root}" if index.ranges is not None else index.root)
    left_out = index.excluded
    print(f"split {split.name}: {_count(len(index), 'image')} in {_count(len(index.classes), 'class')} ({where})"
          f"{f', {left_out} more left out by dataset.exclude' if left_out else ''}")
    print(f"  images per class: {class_counts(index.classes, index.class_counts().tolist())}")
    drawn = draws_summary(config, split, index)
    if drawn:
        print(f"  {drawn}")
    for line in format_lines(tally, root) + size_lines(tally):
        print(f"  {line}")
    kind = "header check and full decode" if deep else "header check"
    rate = f", {tally.files / elapsed:.0f} files/s" if elapsed >= 1 else ""  # startup dominates below
    print(f"  {kind}: {_count(tally.files, 'file')} in {elapsed:.1f} s{rate}, "
          f"{_count(len(tally.problems), 'problem')}")
    if tally.warned:
        print(f"  {_count(len(tally.warned), 'file')} decode with the decoder's warning (damaged data it conceals: "
              f"parts of the image may be grey or smeared); they are read, list them in dataset.exclude to leave "
              f"them out:")
        for screened in tally.warned[:LISTED]:
            shown = screened.path[len(root) + 1:] if screened.path.startswith(root + os.sep) else screened.path
            print(f"    {shown}: {screened.warning}")
        if len(tally.warned) > LISTED:
            print(f"    ... and {len(tally.warned) - LISTED} more")
    if split.mode == "train":
        print(f"  augmentation: {ops_summary(config, split)}")
    hooks, problems = hook_lines(config, split)
    for line in hooks:
        print(f"  {line}")
    for problem in problems + batch_problems(config, split, len(index) - len(tally.problems)):
        print(f"  problem: {problem}")
        tally.split_problems.append(problem)
    return tally


def hook_lines(config: Config, split: SplitConfig) -> tuple[list[str], list[str]]:
    """The split's hooks as a loader would import them (docs/transforms.md): a line for each, or the
    problem that a loader would refuse at build (a path that does not import)."""
    from ..errors import ConfigError
    from ..hooks import split_hooks

    try:
        hooks = split_hooks(config.hook_settings(split), config.dali.graph_hook_args)
    except ConfigError as error:
        return [], [str(error)]
    return [f"hook: {hook.label}" for hook in hooks.all()], []


def batch_problems(config: Config, split: SplitConfig, usable: int) -> list[str]:
    """What `bench`, `show` and a training loop would refuse or stop on for this split's size: an
    epoch_size below one batch per rank, an epoch with no whole batch (drop_last: true)."""
    from ..distributed import detect_ranks
    from ..errors import ConfigError
    from ..weights import check_epoch_size
    from . import no_batch_words

    ranks = detect_ranks(*config.distributed.given())
    try:
        check_epoch_size(config, split, ranks)
    except ConfigError as error:
        return [str(error)]
    size = split.epoch_size or usable
    if split.drop_last and planned_batches(config, split, size, ranks.world_size) == 0:  # a loop would run 0 steps
        return [no_batch_words(split, size, ranks.world_size)]
    return []


def planned_batches(config: Config, split: SplitConfig, size: int, world_size: int) -> int:
    """The batches a rank of the split's loader yields an epoch over `size` positions: the loader's
    own count (fastloader.order), a batch size per output size's steps included."""
    from ..order import EpochOrder
    from ..resolution import Resolution
    resolution = Resolution(split.transform, config.seed, split.batch_sizes) if split.batch_sizes else None
    return len(EpochOrder(size, split.batch_size, mode=split.mode, shuffle=False, drop_last=split.drop_last,
                          seed=config.seed, world_size=world_size, repeats=split.aug_repeats, resolution=resolution))


def draws_summary(config: Config, split: SplitConfig, index) -> str | None:
    """What a train epoch draws where the split weighs its samples or sets epoch_size: the draws and
    the class shares they give (the effective class distribution); None for a plain permutation."""
    from ..order import WeightedDraws
    from ..schema import draws_from
    from ..weights import class_shares, draws_origin, read_weights_file, sample_weights
    keys = draws_from(split)
    size = split.epoch_size or len(index)
    if not keys:
        passes = size / max(1, len(index))
        return None if split.epoch_size is None else \
            f"epoch: {_count(size, 'position')} ({passes:.3g} passes over the split, each in a new order)"
    left_out = [name for name, _ in index.unusable]
    weights = sample_weights(config, split, index, read_weights_file(config, split), left_out)
    draws = WeightedDraws(weights, size)
    return (f"epoch: {_count(size, 'draw')} with replacement, by {draws_origin(split)}; expected class shares: "
            f"{class_shares(index, draws.probabilities)}")


def ops_summary(config: Config, split: SplitConfig) -> str:
    """The train split's ops as the loaders will apply them: the parsed policy or colour jitter."""
    from ..draws import Augmenter
    t = split.transform
    flips = f"hflip {t.hflip:g}" + (f", vflip {t.vflip:g}" if t.vflip else "")
    augmenter = Augmenter(t, config.normalize.mean)
    summary = f"{flips}; ops: {augmenter.describe()}"
    if t.auto_augment and t.color_jitter is not None and not augmenter.jitter:
        summary += f" (color_jitter {t.color_jitter} is off: auto_augment is set, as in timm)"
    return summary


def class_counts(classes: Sequence[str], counts: Sequence[int]) -> str:
    """All classes with their counts when few; else min / median / max and the smallest five."""
    if len(classes) <= MANY_CLASSES:
        return ", ".join(f"{name} {count}" for name, count in zip(classes, counts))
    smallest = sorted(zip(counts, classes))[:5]
    return (f"min {min(counts)}, median {statistics.median(counts):g}, max {max(counts)}; smallest: "
            + ", ".join(f"{name} {count}" for count, name in smallest))


def format_lines(tally: Tally, root: str) -> list[str]:
    """Formats found in the files' headers, files whose suffix names another format, and formats
    DALI cannot decode."""
    lines = ["formats: " + ", ".join(f"{name} {count}" for name, count in tally.formats.most_common())]
    liars = tally.mislabelled
    if liars:
        lines.append(f"suffix does not match the data in {_count(len(liars), 'file')} "
                     f"(the loaders go by the data, other tools may go by the name):")
        lines += [f"  {os.path.relpath(r.path, root)} is {r.format}" for r in liars[:5]]
        lines += [f"  ... and {len(liars) - 5} more"] if len(liars) > 5 else []
    from ..decoding.screen import DALI_FORMATS
    undecodable = {name: count for name, count in tally.formats.items() if name not in DALI_FORMATS | {"unknown"}}
    if undecodable:
        names = ", ".join(f"{name} ({count})" for name, count in undecodable.items())
        lines.append(f"note: DALI cannot decode {names}; the torch backend can, or convert them to JPEG or PNG")
    return lines


def size_lines(tally: Tally) -> list[str]:
    """Width and height percentiles, read from the headers."""
    import numpy as np
    if not tally.widths:
        return []
    lines = []
    for name, sizes in (("width: ", tally.widths), ("height:", tally.heights)):
        values = np.frombuffer(sizes, dtype=np.int64)
        p5, median, p95 = np.percentile(values, [5, 50, 95], method="nearest")
        lines.append(f"{name} min {values.min()}, p5 {p5}, median {median}, p95 {p95}, max {values.max()}")
    return lines


# ---------------------------------------------------------------------------------------------
# Problems and the exclude list
# ---------------------------------------------------------------------------------------------


def report_problems(problems: dict[str, Screened], checked: int, deep: bool) -> None:
    how = "header check and full decode" if deep else "header check; --deep also decodes every file"
    if not problems:
        print(f"no problems in {checked} files ({how})")
        return
    print(f"problems: {len(problems)} of {checked} files ({how}):")
    for relpath, screened in sorted(problems.items())[:LISTED]:
        print(f"  {relpath}: {screened.problem}")
    if len(problems) > LISTED:
        print(f"  ... and {len(problems) - LISTED} more")


def write_exclude_list(path: str, problems: dict[str, Screened], excluded: frozenset[str],
                       previous: str | None) -> None:
    """The problem files, plus those the config already excludes (so the new list can replace the
    old one), relative to dataset.root, one per line."""
    carried = sorted(excluded - set(problems))
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as handle:
        handle.write("# written by fastloader check: files a loader cannot read, relative to dataset.root\n")
        if carried:
            handle.write(f"# {len(carried)} carried over from dataset.exclude ({previous})\n")
            handle.writelines(f"{relpath}\n" for relpath in carried)
        handle.writelines(f"{relpath}\n" for relpath in sorted(problems))
    target = os.path.abspath(path)
    print(f"wrote {_count(len(problems) + len(carried), 'path')} to {path}. To leave them out of every split, set "
          f"dataset.exclude in the config\n  dataset: {{exclude: {target}}}\nor pass --set dataset.exclude={target}")


def _check_exclude_list_path(path: str) -> None:
    """--exclude-list names a file to write: a folder is refused with the fix; the file's folder is
    made (as bench's --json)."""
    from ..errors import ConfigError
    if os.path.isdir(path):
        raise ConfigError(f"--exclude-list {path}: is a folder; name the file to write the problem files to, e.g. "
                          f"--exclude-list {os.path.join(path, 'bad-files.txt')}")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def _count(number: int, noun: str) -> str:
    """'1 file', '3 files', 'no problems', '2 classes'."""
    return plural(number, noun, zero="no")


def _read_excluded(config: Config, root: str) -> frozenset[str]:
    if not config.dataset.exclude:
        return frozenset()
    from ..sources.exclude import read_exclude_list
    excluded = read_exclude_list(config.dataset.exclude, root)
    print(f"dataset.exclude: {_count(len(excluded), 'path')} listed in {config.dataset.exclude} are left out, "
          f"not checked")
    return excluded
