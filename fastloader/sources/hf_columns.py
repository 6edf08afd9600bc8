"""Which columns of a Hugging Face table hold the images and the labels, and the class names: the
`huggingface` schema metadata's Image and ClassLabel features, else the conventional column names
(dataset.image_column / dataset.label_column choose others), in one place for parquet and Arrow."""
from __future__ import annotations

import json
from typing import Sequence

from ..errors import ConfigError
from ..schema import Config

IMAGE_NAMES = ("image", "img")
"""Column names taken as the image column where the metadata names none."""
LABEL_NAMES = ("label", "labels")
"""Column names taken as the label column where the metadata names no ClassLabel."""


def _hf_features(schema) -> dict:
    """The `huggingface` schema metadata's features ({} where there is none, or it is not JSON)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        features = json.loads(raw)["info"]["features"] if raw else {}
    except (ValueError, KeyError, TypeError):
        return {}
    return features if isinstance(features, dict) else {}


def columns(path: str, schema, config: Config) -> tuple[str, str]:
    """(the image column, the label column): the dataset's keys, else Hugging Face's conventions; a
    ConfigError that lists the file's columns where one is not found."""
    import pyarrow as pa

    names = list(schema.names)
    features = _hf_features(schema)
    listed = ", ".join(f"{name} ({schema.field(name).type})" for name in names)
    image = _pick(path, config.dataset.image_column, "image", "Image", IMAGE_NAMES, features, names, listed)
    kind = schema.field(image).type
    plain = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
    if not plain and not (pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0 and
                          (pa.types.is_binary(kind.field("bytes").type) or
                           pa.types.is_large_binary(kind.field("bytes").type))):
        raise ConfigError(f"{path}: the image column {image!r} holds {kind}, not image bytes (binary, or a struct with "
                          f"a binary `bytes` field, as Hugging Face's Image feature); its columns are {listed}. Set "
                          f"dataset.image_column to the column of the images")
    label = _pick(path, config.dataset.label_column, "label", "ClassLabel", LABEL_NAMES, features, names, listed)
    return image, label


def _pick(path: str, chosen: str | None, what: str, feature_type: str, conventional: Sequence[str], features: dict,
          names: list[str], listed: str) -> str:
    """The `what` column: dataset.<what>_column, else the feature of that type in the metadata, else a
    conventional name; a ConfigError listing the file's columns where there is none."""
    column = chosen or \
        next((name for name, feature in features.items() if isinstance(feature, dict) and
              feature.get("_type") == feature_type and name in names), None) or \
        next((name for name in conventional if name in names), None)
    if column is None or column not in names:
        given = f"dataset.{what}_column ({column}) is not one of them" if column else \
            f"none is {'an' if feature_type[0] in 'AEIOU' else 'a'} {feature_type} feature or named " \
            f"{' or '.join(conventional)}"
        raise ConfigError(f"{path}: no {what} column: its columns are {listed}; {given}. Set dataset.{what}_column to "
                          f"the column of the {what}s")
    return column


def image_leaf(path: str, file, schema, image: str) -> tuple[int, int]:
    """(the parquet leaf column of the image bytes, its largest definition level)."""
    import pyarrow as pa

    wanted = f"{image}.bytes" if pa.types.is_struct(schema.field(image).type) else image
    parquet_schema = file.metadata.schema
    for leaf in range(len(parquet_schema)):
        column = parquet_schema.column(leaf)
        if column.path == wanted:
            if column.max_repetition_level:
                raise ConfigError(f"{path}: the image column {image!r} is a list; a row holds one image")
            return leaf, column.max_definition_level
    raise ConfigError(f"{path}: no parquet column {wanted!r} for the image column {image!r}")


def classlabel(schema, label: str) -> tuple[str, ...] | None:
    """The label column's ClassLabel names, where the metadata has them."""
    feature = _hf_features(schema).get(label)
    names = feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None
    return tuple(str(name) for name in names) if isinstance(names, list) and names else None


def label_values(path: str, label: str, column) -> list:
    """The label column as Python ints or class names, as the file holds them (what they mean in the
    split, dataset.classes, is the index's to settle); None where null."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_dictionary(kind):
        column, kind = column.cast(kind.value_type), kind.value_type
    if not (pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise ConfigError(f"{path}: the label column {label!r} holds {kind}, not integer labels or class names; set "
                          f"dataset.label_column to the column of the labels")
    return column.to_pylist()


def null_byte_paths(image_column, null_bytes) -> list | None:
    """The `path` of each row whose image bytes are null (None for the others), from an Image
    feature's struct column; None where the column has no path field or no row lacks its bytes."""
    import pyarrow as pa

    kind = image_column.type
    if not pa.types.is_struct(kind) or kind.get_field_index("path") < 0 or not any(null_bytes):
        return None
    paths = image_column.field("path").to_pylist()
    return [path if missing and isinstance(path, str) and path else None for path, missing in zip(paths, null_bytes)]
