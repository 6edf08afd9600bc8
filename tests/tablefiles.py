"""Parquet and Arrow files of an ImageFolder split, written as Hugging Face's `datasets` writes them: an
`image` struct column (`bytes`, `path`) stored uncompressed and PLAIN, a `label` column, and the class
names as a ClassLabel in the `huggingface` schema metadata."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


def hf_metadata(classes) -> dict[bytes, bytes]:
    features = {"image": {"_type": "Image"}}
    if classes is not None:
        features["label"] = {"names": list(classes), "_type": "ClassLabel"}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def folder_rows(split_dir: Path) -> tuple[list[str], list[bytes], list[int]]:
    """(class names, image bytes, labels) of an ImageFolder split, in the folder format's order."""
    classes = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    files = sorted(split_dir.glob("*/*"))
    return classes, [f.read_bytes() for f in files], [classes.index(f.parent.name) for f in files]


def table(images, labels, classes, label_type=pa.int64()) -> pa.Table:
    column = pa.array([None if data is None else {"bytes": data, "path": None} for data in images], IMAGE_TYPE)
    schema = pa.schema([("image", IMAGE_TYPE), ("label", label_type)], metadata=hf_metadata(classes))
    return pa.Table.from_arrays([column, pa.array(labels, label_type)], schema=schema)


def write_parquet(path: Path, data: pa.Table, row_group_size: int = 100, **options) -> Path:
    """As `datasets` writes an image dataset: the image leaves uncompressed and PLAIN, the rest snappy."""
    settings = {"compression": {"image.bytes": "none", "image.path": "none", "label": "snappy"},
                "use_dictionary": ["label"], "column_encoding": {"image.bytes": "PLAIN", "image.path": "PLAIN"},
                "write_page_index": True, **options}
    pq.write_table(data, path, row_group_size=row_group_size, **settings)
    return path


def write_arrow(path: Path, data: pa.Table, stream: bool = True, max_chunksize: int = 100) -> Path:
    """An Arrow IPC stream (what `datasets` keeps in its cache and `save_to_disk` writes), or file."""
    with pa.OSFile(str(path), "wb") as sink:
        opener = pa.ipc.new_stream if stream else pa.ipc.new_file
        with opener(sink, data.schema) as writer:
            writer.write_table(data, max_chunksize=max_chunksize)
    return path


def split_as_parquet(split_dir: Path, out: Path, files: int = 2, row_group_size: int = 100) -> tuple[str, ...]:
    """The folder split in `files` parquet files (rows in the folder's order); returns its class names."""
    classes, images, labels = folder_rows(split_dir)
    out.mkdir(parents=True, exist_ok=True)
    per = -(-len(images) // files)
    for k in range(files):
        write_parquet(out / f"train-{k:05d}-of-{files:05d}.parquet",
                      table(images[k * per:(k + 1) * per], labels[k * per:(k + 1) * per], classes), row_group_size)
    return tuple(classes)


def split_as_arrow(split_dir: Path, out: Path, stream: bool = True) -> tuple[str, ...]:
    classes, images, labels = folder_rows(split_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_arrow(out / "data-00000-of-00001.arrow", table(images, labels, classes), stream)
    return tuple(classes)
