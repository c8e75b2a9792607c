"""Hugging Face datasets (saved to disk, or on the hub through its cache, offline) as token
batches: the split, the column, and Arrow batches of it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from posstats.corpus.readers.arrow import arrow_batches, check_column
from posstats.corpus.readers.files import _HF_BUILDERS, FORMATS, guess_format
from posstats.corpus.readers.spec import ReaderSpec, describe_exception
from posstats.corpus.remote import hub_dataset, is_url, url_filesystem, url_info
from posstats.counting.tokens import TokenBatch
from posstats.errors import InputError, OptionError, PosstatsError
from posstats.progress import bars_shown

def _import_datasets() -> Any:
    """The ``datasets`` package (an optional extra: only Hugging Face inputs need it)."""
    try:
        import datasets
    except ImportError:
        msg = "reading a Hugging Face dataset needs the datasets package: pip install 'posstats[hf]'"
        raise InputError(msg) from None
    return datasets


@contextlib.contextmanager
def _datasets_bars(datasets: Any) -> Iterator[None]:
    """``datasets``' own progress bars (building its Arrow cache) shown only where posstats'
    bars show (:func:`posstats.progress.bars_shown`: not ``-q``, stderr a terminal), and
    put back as they were after."""
    logging = datasets.utils.logging
    was = logging.is_progress_bar_enabled()
    if was and not bars_shown():
        logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()


def _read_hf(path: str, spec: ReaderSpec) -> Iterator[TokenBatch]:
    datasets = _import_datasets()  # heavy; only imported when an HF input is read

    if is_url(path):
        saved, builder = _hf_url_kind(path, spec)
    else:
        if not os.path.exists(path):
            msg = f"{path}: no such file or folder"
            raise InputError(msg)
        saved = os.path.isdir(path) and any(
            os.path.isfile(os.path.join(path, marker)) for marker in ("state.json", "dataset_dict.json")
        )
        builder = None if os.path.isdir(path) else _HF_BUILDERS[guess_format(path)]
    if spec.name is None:
        if builder != "text":
            msg = f"{path}: tokenizer= needs text_column= naming the text column"
            raise PosstatsError(msg)
        spec = dataclasses.replace(spec, text_column="text")  # the text builder's only column
    remote = {"storage_options": dict(spec.storage_options)} if is_url(path) and spec.storage_options else {}
    try:
        with _datasets_bars(datasets):
            if saved:
                ds = datasets.load_from_disk(path, **remote)
            elif builder is None:
                revision = path.rstrip("/").partition("@")[2] or None
                ds = datasets.load_dataset(hub_dataset(path) or path, revision=revision, streaming=spec.hf_streaming)
            else:
                kwargs = {"delimiter": "\t"} if builder == "csv" and ".tsv" in path.lower() else {}
                ds = datasets.load_dataset(builder, data_files=[path], streaming=spec.hf_streaming, **remote, **kwargs)
    except Exception as exc:  # noqa: BLE001 - datasets raises many unrelated types
        msg = f"{path}: cannot load as a Hugging Face dataset ({describe_exception(exc)})"
        raise InputError(msg) from exc
    ds = _pick_split(ds, path, spec.hf_split)
    if spec.hf_streaming and isinstance(ds, datasets.Dataset):
        ds = ds.to_iterable_dataset()
    names = ds.column_names  # None for a streamed dataset whose features are unknown
    if names is not None and spec.name not in names:
        msg = f"{path}: no column {spec.name!r} (available: {', '.join(names) or 'none'})"
        raise InputError(msg)
    yield from arrow_batches(_hf_columns(ds, path, spec), path, spec)


def _hf_url_kind(path: str, spec: ReaderSpec) -> tuple[bool, str | None]:
    """``(saved, builder)`` of a URL read as a Hugging Face dataset: a ``save_to_disk``
    folder, a hub repository (``hf://datasets/ORG/NAME``, builder None), or a data file
    (its builder)."""
    if hub_dataset(path):
        return False, None
    fs, root = url_filesystem(path, spec.storage_options)
    info = url_info(path, spec.storage_options)
    if info.get("type") != "directory":
        fmt = guess_format(path)
        if fmt == "hf":
            msg = f"{path}: cannot tell the format of this file; choose one of {', '.join(FORMATS)}"
            raise InputError(msg)
        return False, _HF_BUILDERS[fmt]
    if any(fs.exists(f"{root.rstrip('/')}/{marker}") for marker in ("state.json", "dataset_dict.json")):
        return True, None
    msg = f"{path}: a folder URL must be a dataset saved with save_to_disk (state.json or dataset_dict.json)"
    raise InputError(msg)


def _hf_columns(ds: Any, path: str, spec: ReaderSpec) -> Iterator[pa.ChunkedArray]:
    tables = iter(ds.with_format("arrow").iter(batch_size=spec.batch_size))
    checked = False
    while True:
        try:
            table = next(tables)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 - datasets raises many unrelated types
            msg = f"{path}: cannot read as a Hugging Face dataset ({describe_exception(exc)})"
            raise InputError(msg) from exc
        if not checked:
            check_column(path, table.schema, spec)
            checked = True
        yield table.column(spec.name)


def _pick_split(ds: Any, path: str, split: str | None) -> Any:
    datasets = _import_datasets()

    if not isinstance(ds, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        if split is not None:
            msg = f"{path}: is a single dataset without splits; drop hf_split={split!r}"
            raise InputError(msg)
        return ds
    splits = list(ds.keys())
    if split is None:
        if len(splits) != 1:
            msg = f"{path}: holds the splits {', '.join(splits)}; choose one with {{split}} (hf_split=)"
            raise OptionError(msg)
        split = splits[0]
    if split not in splits:
        msg = f"{path}: no split {split!r} (available: {', '.join(splits)}); choose one with {{split}} (hf_split=)"
        raise OptionError(msg)
    return ds[split]
