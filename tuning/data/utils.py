"""Helpers of the data framework (fms-hf-tuning v3.1.0's ``tuning.data.utils``): which ``datasets`` builder reads a
file, reading a YAML or JSON config, and joining datasets whose columns agree."""

import io
import json
import logging
import os

from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict, concatenate_datasets

logger = logging.getLogger(__name__)

# File extension → the ``datasets`` packaged builder that reads it.
_BUILDERS = {
    ".txt": "text",
    ".md": "text",
    ".json": "json",
    ".jsonl": "json",
    ".arrow": "arrow",
    ".parquet": "parquet",
    ".csv": "csv",
}
# The builders a file's extension alone picks: a path with one of those extensions names a file.
DATA_FILE_BUILDERS = frozenset(_BUILDERS.values())


def get_extension(file_path: str) -> str:
    """The lower-cased extension of ``file_path``, dot included."""
    return os.path.splitext(file_path)[1].lower()


def get_loader_for_filepath(file_path: str) -> str:
    """The builder for ``file_path`` by its extension; an unknown extension comes back as itself ("" for none)."""
    extension = get_extension(file_path)
    return _BUILDERS.get(extension, extension)


def load_yaml_or_json(file_path: str) -> dict | None:
    """The content of a ``.yaml``/``.yml`` or ``.json`` file; None for any other extension."""
    import yaml

    extension = get_extension(file_path)
    with open(file_path, encoding="utf-8") as handle:
        if extension in (".yaml", ".yml"):
            return yaml.safe_load(handle)
        if extension == ".json":
            return json.load(handle)
    return None


def resolve_iterable_dataset_features(data: IterableDataset) -> IterableDataset:
    """A streaming dataset whose column names are known (``datasets`` leaves them None after some maps)."""
    if data.column_names is None:
        if not isinstance(data, IterableDataset):
            raise ValueError(f"cannot find the column names of a {type(data).__name__}")
        data = data._resolve_features()
    return data


def _features(data, split: str = "train"):
    return data[split].features if isinstance(data, DatasetDict | IterableDatasetDict) else data.features


def _validate_mergeable_datasets(datasets: list, default_split: str = "train") -> None:
    """``datasets`` can be joined: the same column names in each (of its ``default_split`` for a dict dataset);
    else a ``ValueError`` naming the ones that differ (v3.1.0's name)."""
    if len(datasets) <= 1:
        return
    reference = _features(datasets[0], default_split)
    mismatched = [index for index, data in enumerate(datasets) if set(_features(data, default_split)) != set(reference)]
    if mismatched:
        raise ValueError(
            f"datasets to join should have the same column names: {sorted(reference)} in the first, "
            f"others in dataset(s) {mismatched}"
        )


def maybe_align_datasets(datasets: list) -> None:
    """Check, in place, that ``datasets`` have the same columns, and cast them all to the first one's features."""
    try:
        for index, data in enumerate(datasets):
            if isinstance(data, IterableDataset):
                datasets[index] = resolve_iterable_dataset_features(data)
        _validate_mergeable_datasets(datasets)
        for index in range(1, len(datasets)):
            datasets[index] = datasets[index].cast(_features(datasets[0]))
    except Exception as exc:
        raise ValueError(f"Failed to align datasets: {exc}") from exc


def _concatenate(datasets: list):
    if len(datasets) == 1:
        return datasets[0]
    maybe_align_datasets(datasets)
    joined = concatenate_datasets(datasets)
    return resolve_iterable_dataset_features(joined) if isinstance(joined, IterableDataset) else joined


def try_concatenate_datasets(all_datasets: list):
    """One dataset of the rows of all: flat datasets end to end, dict datasets split by split (a split only some
    have is kept). Mixed kinds, or columns that differ, are a ``ValueError``."""
    if len(all_datasets) == 1:
        return all_datasets[0]
    try:
        if all(isinstance(data, Dataset | IterableDataset) for data in all_datasets):
            return _concatenate(list(all_datasets))
        if all(isinstance(data, DatasetDict | IterableDatasetDict) for data in all_datasets):
            splits = dict.fromkeys(split for data in all_datasets for split in data)
            merged = {split: _concatenate([data[split] for data in all_datasets if split in data]) for split in splits}
            if all(isinstance(data, IterableDatasetDict) for data in all_datasets):
                return IterableDatasetDict(merged)
            return DatasetDict(merged)
        raise ValueError(f"cannot concatenate mixed kinds of datasets: {[type(d).__name__ for d in all_datasets]}")
    except Exception as exc:
        raise ValueError(f"An error occurred while concatenating datasets: {exc}") from exc


def try_convert_bytes_dict_to_pil(image):
    """Images stored as ``{"bytes": ...}`` (alone, in a list, or in a list of lists) as PIL images, same shape."""
    from PIL import Image

    def convert(item):
        return Image.open(io.BytesIO(item["bytes"])) if isinstance(item, dict) and "bytes" in item else item

    if isinstance(image, list):
        return [[convert(item) for item in entry] if isinstance(entry, list) else convert(entry) for entry in image]
    return convert(image)


def try_convert_image_to_rgb(image):
    """PIL images (alone, in a list, or in a list of lists) in RGB mode, same shape."""
    from PIL import Image

    def convert(item):
        return item.convert("RGB") if isinstance(item, Image.Image) and item.mode != "RGB" else item

    if isinstance(image, list):
        return [[convert(item) for item in entry] if isinstance(entry, list) else convert(entry) for entry in image]
    return convert(image)
