"""Where the torch backend's time goes, per stage, in ms per image on one core.

Each stage runs the backend's own code in this process with one torch thread, over every file of
the split once, so the numbers add up to what one worker spends per image:
- read: the file's bytes;
- header + crop: the JPEG marker walk (Pillow for other files, and with FASTLOADER_JPEG_DECODER=pillow)
  reads the size and EXIF orientation, the crop is chosen from them;
- decode: `load_region` minus the two above, also split by the decoder each image went to (from its
  header and crop: nvImageCodec's region decode, Pillow's draft where the crop is 2x the output or
  more, the whole file (nvImageCodec), Pillow); FASTLOADER_JPEG_DECODER=whole measures the whole-file
  decode of before;
- crop + resize (+ flip): `SampleTransform.resize` on the decoded pixels;
- collate + normalize: the CPU path's `NormalizingCollate` into a batch whose memory is already
  mapped, as a worker does with a reused buffer (collate.BatchPool), per image;
- fresh shared-memory batch: what a worker pays when it has no dropped batch to reuse: a new float
  batch in shared memory (allocation and page faults);
- transfer: on CUDA, the pinned uint8 batch's copy to the GPU; on CPU there is none.

Then the ratio that peers.py measures with whole loaders (the torch backend against the decode_jpeg
limit), measured here without processes and queues in the way: the worker path (the dataset's
__getitems__ and the CPU collate, as a worker runs them) and the limit's work (read each file, decode
it whole) over the same files, in interleaved rounds, medians. On a shared 2-core VM the loaders'
ratio moves by 5-10% from run to run; this one by about 1%.

    python benchmarks/stages.py --data DIR
    python benchmarks/stages.py --split train --rounds 9 --json stages.json
"""
from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

import harness
import numpy as np
import torch
from PIL import Image

import fastloader
from fastloader.config import IMAGE_EXTENSIONS
from fastloader.decoding.decode import decoder_choice, describe, load_region, plain_jpeg_header
from fastloader.decoding.screen import sniff
from fastloader.machine import hardware
from fastloader.sources.folder import scan_folder
from torch_loader.collate import BatchPool, NormalizingCollate
from torch_loader.dataset import ImageDataset
from torch_loader.loader import normalizer_of, sample_transform
from torch_loader.prefetch import Normalizer
from torch_loader.transforms import SampleTransform

STAGES = ("read", "header + crop", "decode", "crop + resize", "collate + normalize", "fresh shared batch",
          "transfer")
REUSED = "fresh shared batch"
"""Left out of the total: workers reuse dropped batches (collate.BatchPool) unless the trainer keeps them."""


class _MappedBatch(BatchPool):
    """One batch whose pages are mapped already, as those of a buffer a worker reuses."""

    def __init__(self, batch_size: int, size: int, dtype: torch.dtype):
        super().__init__(0, 0, (batch_size, 3, size, size), dtype, channels_last=False)
        self.batch = torch.zeros(self.shape, dtype=dtype)

    def take(self, count, side=None):
        return self.batch[:count], None, -1


def _timed(function, *args):
    started = time.perf_counter()
    value = function(*args)
    return value, time.perf_counter() - started


def measure_split(split: str, data: Path, batch_size: int, size: int, rounds: int = 0) -> dict:
    """ms per image for each stage over the split's files, how often the decoder could shrink, and
    with `rounds`, the worker path against the decode_jpeg limit (against_limit)."""
    index = scan_folder(str(data / split), IMAGE_EXTENSIONS)
    config = fastloader.load_config(str(harness.CONFIG), {"dataset.root": str(data), f"{split}.transform.size": size,
                                                          "output.device": "cpu"})
    split_config = config.split(split)
    transform = sample_transform(split_config, exif_orientation=config.dataset.exif_orientation)
    normalizer = normalizer_of(config, torch.device("cpu"))
    totals = dict.fromkeys(STAGES, 0.0)
    samples, by_decoder = [], {}
    for i in range(len(index)):
        path = index.path(i)

        ops = transform.sample_ops([i])[0]  # a worker draws these for its whole batch at once, untimed here

        def choose(w, h, ops=ops):
            return transform.crop_for(w, h, ops)
        data_bytes, read = _timed(lambda: open(path, "rb").read())
        totals["read"] += read
        started = time.perf_counter()
        walked = plain_jpeg_header(data_bytes) if decoder_choice() != "pillow" else None
        if walked is not None:
            choose(walked.width, walked.height)
        else:
            with Image.open(io.BytesIO(data_bytes)) as image:
                image.getexif()
                choose(*image.size)
        header = time.perf_counter() - started
        totals["header + crop"] += header
        (pixels, crop, decoder), seconds = _timed(load_region, path, choose, size)
        totals["decode"] += seconds
        count, decode_seconds = by_decoder.get(decoder, (0, 0.0))
        by_decoder[decoder] = count + 1, decode_seconds + seconds - read - header
        out, seconds = _timed(transform.resize, pixels, crop)
        totals["crop + resize"] += seconds
        samples.append((out, index.label(i), i))  # (image, label, seed), as the dataset gives
    totals["decode"] -= totals["read"] + totals["header + crop"]
    collate = NormalizingCollate(normalizer, _MappedBatch(batch_size, size, normalizer.dtype))
    batches = [samples[s:s + batch_size] for s in range(0, len(samples) - batch_size + 1, batch_size)]
    for batch in batches[:1]:
        collate(batch)  # maps the batch's pages, untimed
    for batch in batches:
        (images, *_), seconds = _timed(collate, batch)
        totals["collate + normalize"] += seconds
        nbytes = images.numel() * images.element_size()
        started = time.perf_counter()
        storage = torch.UntypedStorage._new_shared(nbytes)
        torch.empty(0, dtype=torch.uint8).set_(storage).fill_(0)  # first touch: the page faults a worker pays
        totals[REUSED] += time.perf_counter() - started
        if torch.cuda.is_available():
            pinned = torch.stack([image for image, *_ in batch]).pin_memory()
            torch.cuda.synchronize()
            _, seconds = _timed(lambda: (pinned.to("cuda", non_blocking=True), torch.cuda.synchronize()))
            totals["transfer"] += seconds
    batched = max(1, len(batches) * batch_size)
    per_image = {stage: 1000 * total / (batched if stage in STAGES[4:] else len(index))
                 for stage, total in totals.items()}
    decoders = {name: {"images": count, "ms_per_image": 1000 * total / count}
                for name, (count, total) in sorted(by_decoder.items(), key=lambda item: -item[1][0])}
    result = {"images": len(index), "ms_per_image": per_image, "decoders": decoders,
              "transfer": "pinned uint8 to cuda" if torch.cuda.is_available() else "none (CPU output)"}
    if rounds:
        result["against_limit"] = against_limit(index, transform, normalizer, batch_size, rounds)
    return result


def against_limit(index, transform: SampleTransform, normalizer: Normalizer, batch_size: int, rounds: int) -> dict:
    """ms per image of the worker path and of the decode_jpeg limit over the same files, interleaved
    rounds in this process after one untimed pass of each; their medians and the limit / backend ratio."""
    dataset = ImageDataset(index, transform)
    # a reused batch, as a worker's
    collate = NormalizingCollate(normalizer, _MappedBatch(batch_size, transform.size, normalizer.dtype))
    jpegs = [i for i in range(len(index)) if _is_jpeg(index.path(i))]  # the limit decodes JPEGs only
    items = np.array([(i, i) for i in jpegs], dtype=np.int64).reshape(-1, 2)  # (sample, seed), seeds as above
    used = len(items) // batch_size * batch_size or len(items)  # full batches (one batch shape), else one short
    batches = [items[start:start + batch_size] for start in range(0, used, batch_size)]
    paths = [index.path(i) for batch in batches for i in batch[:, 0]]
    if not paths:
        return {"images": 0, "rounds": rounds, "left_out": len(index), "ratio": None}

    def backend():
        for batch in batches:
            collate(dataset.__getitems__(batch))

    def limit():
        for path in paths:
            harness.decode_whole_file(path)

    runs = {"limit": limit, "backend": backend}
    ms = {name: [] for name in runs}
    for round_number in range(rounds + 1):
        for name, run in runs.items():
            _, seconds = _timed(run)
            if round_number:  # the first pass warms the page cache and the allocator
                ms[name].append(1000 * seconds / len(paths))
    limit_ms, backend_ms = statistics.median(ms["limit"]), statistics.median(ms["backend"])
    return {"images": len(paths), "rounds": rounds, "left_out": len(index) - len(jpegs), "limit_ms": limit_ms,
            "backend_ms": backend_ms, "ratio": limit_ms / backend_ms, "ms_per_round": ms}


def _is_jpeg(path: str) -> bool:
    with open(path, "rb") as handle:
        return sniff(handle.read(16)) == "JPEG"


def measure(data: Path, splits: list[str], batch_size: int, size: int, rounds: int = 5) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for split in splits:  # a first pass warms the page cache and the allocator
            measure_split(split, data, batch_size, size)
        return {split: measure_split(split, data, batch_size, size, rounds) for split in splits}
    finally:
        torch.set_num_threads(threads)


def print_stages(stages: dict) -> None:
    print("\ntorch backend, ms per image on one core (one torch thread, in this process):")
    splits = list(stages)
    print(f"  {'stage':<22}" + "".join(f"{split:>10}" for split in splits))
    for stage in STAGES:
        print(f"  {stage:<22}" + "".join(f"{stages[s]['ms_per_image'][stage]:10.3f}" for s in splits))
    total = {s: sum(ms for stage, ms in stages[s]["ms_per_image"].items() if stage != REUSED) for s in splits}
    print(f"  {'total (reused batches)':<22}" + "".join(f"{total[s]:10.3f}" for s in splits))
    print(f"  {'-> images/s per core':<22}" + "".join(f"{1000 / total[s]:10.0f}" for s in splits))
    print(f"  decoders: {describe()}")
    for s in splits:
        info = stages[s]
        used = ", ".join(f"{name} {d['images']} images ({d['ms_per_image']:.3f} ms each)"
                         for name, d in info["decoders"].items())
        print(f"  {s}: of {info['images']} images: {used}; transfer: {info['transfer']}")
    compared = [s for s in splits if stages[s].get("against_limit", {}).get("images")]
    if compared:
        rounds = stages[compared[0]]["against_limit"]["rounds"]
        print(f"\nworker path against the decode_jpeg limit, same files, this process, one core "
              f"(median of {rounds} interleaved rounds):")
        print(f"  {'ms per image':<28}" + "".join(f"{split:>10}" for split in compared))
        for label, key in (("limit: read + decode whole", "limit_ms"), ("torch backend worker path", "backend_ms")):
            print(f"  {label:<28}" + "".join(f"{stages[s]['against_limit'][key]:10.3f}" for s in compared))
        print(f"  {'-> limit / backend':<28}" + "".join(f"{stages[s]['against_limit']['ratio']:9.2f}x"
                                                       for s in compared))
    for s in splits:
        left_out = stages[s].get("against_limit", {}).get("left_out")
        if left_out:
            print(f"  {s}: {left_out} files that are not JPEGs left out of this comparison")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_data_argument(parser)
    parser.add_argument("--split", choices=("train", "val", "both"), default="both", help="default: both")
    parser.add_argument("--batch-size", type=int, default=64, help="default: 64")
    parser.add_argument("--size", type=int, default=224, help="output height and width (default: 224)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="interleaved rounds of the worker path against the decode_jpeg limit; 0 skips "
                             "them (default: 5)")
    parser.add_argument("--json", type=Path, help="write the ms per image of each stage to this file")
    arguments = parser.parse_args()
    data = harness.check_data(parser, arguments.data, harness.splits_of(arguments))
    if arguments.rounds < 0:
        parser.error("--rounds must be >= 0")
    per_stage = measure(data, harness.splits_of(arguments), arguments.batch_size, arguments.size, arguments.rounds)
    print_stages(per_stage)
    if arguments.json:
        arguments.json.write_text(json.dumps({"hardware": hardware(), "stages": per_stage}, indent=2) + "\n")
        print(f"wrote {arguments.json}")
    sys.exit(0)
