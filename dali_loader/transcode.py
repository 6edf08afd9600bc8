"""PNG copies of the files DALI's decoder cannot read (GIF), so that the DALI backend serves every
file the torch backend does.

Screening notes each file's format (fastloader.screening); those outside DALI_FORMATS are decoded
once with Pillow to RGB, the torch backend's own colour conversion, and stored losslessly as PNG
under the fastloader cache folder, so DALI sees the same pixels. A copy is written once per
dataset and machine, then reused.
"""
from __future__ import annotations

import logging
import os
from typing import Mapping

from PIL import Image

from fastloader.imaging.rgb import to_rgb
from fastloader.paths import transcode_folder
from fastloader.samples import SampleIndex
from fastloader.sources.reading import open_bytes
from fastloader.words import plural

log = logging.getLogger("fastloader")


def transcoded_for_dali(index: SampleIndex, formats: Mapping[int, str]) -> dict[int, str]:
    """Sample -> a PNG copy of each file DALI cannot decode (`formats`: sample -> its format),
    written once into the cache folder: decoded with Pillow to RGB, stored losslessly."""
    if not formats:
        return {}
    folder = transcode_folder(index.root, index.fingerprint)
    folder.mkdir(parents=True, exist_ok=True)
    copies = {}
    for sample, fmt in formats.items():
        target = folder / f"{sample}.png"
        if not target.exists():
            with open_bytes(index.location(sample)) as handle, Image.open(handle) as image:
                partial = target.with_suffix(f".{os.getpid()}.tmp")
                to_rgb(image).save(partial, format="PNG")
                os.replace(partial, target)
        copies[sample] = str(target)
    log.info("%s of %s %s in formats DALI cannot decode (%s): DALI reads PNG copies in %s",
             plural(len(copies), "file"), index.root, "is" if len(copies) == 1 else "are",
             ", ".join(sorted(set(formats.values()))), folder)
    return copies
