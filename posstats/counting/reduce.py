"""Reducing saved counts: exact signed sums of partials, their storage, their integrity.

A reduction reads saved counts (run-store partials, reduce intermediates, a previous
total) one at a time and sums them with signs: ``total = sum_i sign_i * C_i`` with
``sign_i`` in {+1, -1}. Counts are additive (THEORY section 1), so a refresh computes the
new total as ``old total - removed shards + added shards`` and gets the same integers as
a full recount. Integer sums and the XOR of fingerprints do not depend on the order.

Integrity of partials (:func:`load_partial`): a run-store partial's completion marker
(``done.json``, written by :meth:`posstats.corpus.shard_store.RunStore.write_partial`)
records the totals of the partial and ``sha256``, the SHA-256 of its counts file. A
marked partial read for a reduction must have that checksum (markers of older stores have
none: then only the totals are checked) and a matrix whose sum equals both the marker's
and the file's ``tokens``. Otherwise it is corrupt: :class:`CorruptPartialError`, one line
naming the partial and the two totals. The check lives here, with the sums, because every
sum must run it on every marked partial it reads; the store only writes the markers.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from posstats.counting.counts import CountSpec, PositionalCounts, combine_fingerprints
from posstats.counting.io import (
    SPARSE_FILE,
    counts_file,
    load_counts,
    load_header,
    save_counts,
)
from posstats.counting.scipy_sparse import sp
from posstats.errors import InputError, PosstatsError
from posstats.storage.jsontext import read_json_file, write_json_atomic
from posstats.storage.publish import file_sha256

__all__ = [
    "PARTIAL_MARKER",
    "CorruptPartialError",
    "check_partial",
    "check_summable",
    "load_partial",
    "mark_result",
    "reduce_partials",
    "sum_partials",
]

PARTIAL_MARKER = "done.json"  # a run-store partial's completion marker (names its counts file)


def check_summable(spec: CountSpec, /) -> None:
    """Refuse a spec whose flat keys ``position * V + token`` (int64) cannot be formed.

    Raises:
        PosstatsError: ``n V >= 2**62``.
    """
    if spec.positions * spec.vocab_size >= 2**62:
        msg = f"positions x vocabulary = {spec.positions} x {spec.vocab_size} is too large to key"
        raise PosstatsError(msg)


# ----------------------------------------------------------------------------- integrity


class CorruptPartialError(PosstatsError):
    """A marked partial whose counts file does not match its marker (see the module
    docstring). ``path`` is the partial's folder as given, ``detail`` the message without
    the advice to delete it."""

    path: str = ""
    detail: str = ""


def _matrix_total(counts: PositionalCounts) -> int:
    """``C.sum()`` as a Python int (int64 accumulation)."""
    if counts.is_sparse:
        return int(counts.matrix.data.sum(dtype=np.int64))
    return int(np.asarray(counts.matrix).sum(dtype=np.int64))


def _integrity_problems(file: Path, part: PositionalCounts, marker: dict[str, Any], actual_sha: str | None) -> list[str]:
    """What disagrees between a loaded partial and its marker (checksum, the file's tokens)."""
    recorded = marker.get("sha256")
    problems = []
    if recorded and actual_sha != recorded:
        problems.append(f"sha256 {actual_sha[:16]}... of {file.name}, the marker records {str(recorded)[:16]}...")
    if part.tokens != marker.get("tokens"):
        problems.append(f"its file says {part.tokens:,} tokens")
    return problems


def _corrupt(folder: Path, total: int, expected: Any, problems: list[str]) -> CorruptPartialError:
    """The one-line error for a partial whose counts disagree with its marker."""
    exp = f"{expected:,}" if isinstance(expected, int) else repr(expected)
    detail = (
        f"{folder}: corrupt partial: its counts sum to {total:,} tokens, its marker records {exp} "
        f"({'; '.join(problems) or 'the file was changed after it was written'})"
    )
    exc = CorruptPartialError(f"{detail}; delete {folder} and rerun to count that shard again")
    exc.path, exc.detail = str(folder), detail
    return exc


def load_partial(path: str | os.PathLike, /) -> PositionalCounts:
    """Load saved counts; when ``path`` is a marked partial (its folder holds ``done.json``
    naming this counts file), check it against the marker first.

    The checks: the SHA-256 of the counts file equals the marker's ``sha256`` (skipped for
    markers written before checksums existed), and the sum of the matrix equals both the
    marker's and the file's ``tokens`` (``tokens = C.sum()``). Costs one extra read of the
    file (about 0.1 s for 51 MB); other counts (reduce intermediates, results) load as
    :func:`posstats.counting.io.load_counts` does.

    Raises:
        CorruptPartialError: ``"<folder>: corrupt partial: its counts sum to A tokens, its
            marker records B (...); delete <folder> and rerun to count that shard again"``.
        InputError: an unreadable counts file (as :func:`~posstats.counting.io.load_counts`).
    """
    folder = Path(path) if os.path.isdir(path) else Path(path).parent
    file = counts_file(path)
    marker = read_json_file(folder / PARTIAL_MARKER, what="run-store file")
    if not marker or marker.get("counts_file") != file.name:
        return load_counts(file)
    actual_sha = file_sha256(file) if marker.get("sha256") else None
    part = load_counts(file, check_total=False)  # checked below, against the marker too
    total = _matrix_total(part)
    problems = _integrity_problems(file, part, marker, actual_sha)
    if problems or total != marker.get("tokens"):
        raise _corrupt(folder, total, marker.get("tokens"), problems)
    return part


def check_partial(path: str | os.PathLike, /) -> None:
    """Check saved counts against their marker without loading the counts when the
    marker's SHA-256 matches the file (and its header's tokens the marker's): the file is
    then byte for byte the one its writer checked. Otherwise the full check of
    :func:`load_partial` runs (and raises its :class:`CorruptPartialError`)."""
    folder = Path(path) if os.path.isdir(path) else Path(path).parent
    file = counts_file(path)
    marker = read_json_file(folder / PARTIAL_MARKER, what="run-store file")
    if marker and marker.get("counts_file") == file.name and marker.get("sha256") == file_sha256(file) \
            and load_header(file).tokens == marker.get("tokens"):
        return
    load_partial(path)


# ----------------------------------------------------------------------------- sums


def _signed_keys(part: PositionalCounts, sign: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat keys ``k = i V + v`` (int64) of the non-zero cells of ``part`` and ``sign * C[i, v]``."""
    V = part.spec.vocab_size
    if part.is_sparse:
        coo = part.matrix.tocoo()
        keys = coo.row.astype(np.int64) * V + coo.col.astype(np.int64)
        return keys, coo.data.astype(np.int64) * sign
    flat = np.asarray(part.matrix, dtype=np.int64).reshape(-1)
    keys = np.flatnonzero(flat)
    return keys, flat[keys] * sign


def _merge_keys(keys: list[np.ndarray], vals: list[np.ndarray], spec: CountSpec) -> sp.csr_array:
    """CSR ``(n, V)`` int64 of the summed (key, value) pieces; cells summing to 0 dropped."""
    n, V = spec.positions, spec.vocab_size
    k = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    v = np.concatenate(vals) if vals else np.zeros(0, np.int64)
    order = np.argsort(k, kind="stable")
    k, v = k[order], v[order]
    first = np.ones(len(k), dtype=bool)
    first[1:] = k[1:] != k[:-1]
    starts = np.flatnonzero(first)
    k = k[starts]
    v = np.add.reduceat(v, starts) if len(v) else v
    keep = v != 0
    k, v = k[keep], v[keep]
    rows, cols = np.divmod(k, V)
    return sp.csr_array((v, (rows, cols)), shape=(n, V), dtype=np.int64)


class _SignedSum:
    """Running ``sum sign * C``: a dense flat int64 ``(n V,)`` total, or sparse (key, value)
    pieces merged at the end; totals add with the sign, fingerprints XOR."""

    def __init__(self, spec: CountSpec, *, dense: bool) -> None:
        self.spec = spec
        self.total = np.zeros(spec.positions * spec.vocab_size, dtype=np.int64) if dense else None
        self.keys: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.sequences = self.windows = self.tokens = 0
        self.fingerprint = ""

    def add(self, part: PositionalCounts, sign: int) -> None:
        self.sequences += sign * part.sequences
        self.windows += sign * part.windows
        self.tokens += sign * part.tokens
        self.fingerprint = combine_fingerprints(self.fingerprint, part.fingerprint)
        if self.total is not None and not part.is_sparse:
            flat = np.asarray(part.matrix, dtype=np.int64).reshape(-1)
            (np.add if sign > 0 else np.subtract)(self.total, flat, out=self.total)
            return
        keys, vals = _signed_keys(part, sign)
        if self.total is not None:
            np.add.at(self.total, keys, vals)
        else:
            self.keys.append(keys)
            self.vals.append(vals)

    def result(self, metadata: dict[str, str] | None) -> PositionalCounts:
        n, V = self.spec.positions, self.spec.vocab_size
        matrix = self.total.reshape(n, V) if self.total is not None else _merge_keys(self.keys, self.vals, self.spec)
        return PositionalCounts(self.spec, matrix, self.sequences, self.windows, self.tokens, self.fingerprint,
                                dict(metadata or {}))


def _load_item(path: str | os.PathLike, sign: int, spec: CountSpec,
               corrupt: list[CorruptPartialError] | None) -> PositionalCounts | None:
    """One checked summand, or None for a corrupt partial collected into ``corrupt``."""
    if sign not in (1, -1):
        msg = f"sign must be +1 or -1, got {sign!r}"
        raise ValueError(msg)
    try:
        part = load_partial(path)
    except CorruptPartialError as exc:
        if corrupt is None:
            raise
        corrupt.append(exc)
        return None
    if part.spec != spec:
        msg = f"{path}: counted under {part.spec}, not {spec}"
        raise InputError(msg)
    return part


def sum_partials(
    items: Sequence[tuple[str | os.PathLike, int]],
    spec: CountSpec,
    /,
    *,
    dense: bool,
    metadata: dict[str, str] | None = None,
    corrupt: list[CorruptPartialError] | None = None,
) -> PositionalCounts:
    """Exact signed sum of saved counts: ``sum(sign * counts(path))``.

    Args:
        items: (counts folder or file, +1 or -1) pairs; -1 subtracts (a shard that left
            the corpus). Loaded one at a time, marked partials checked against their
            markers (:func:`load_partial`).
        spec: every item must have been counted under it.
        dense: accumulate in a dense int64 ``n x V`` array (else sorted sparse keys).
        metadata: metadata of the result (items' metadata is not merged).
        corrupt: None raises at the first corrupt partial; a list collects every corrupt
            partial's error instead (and leaves it out of the sum, which is then not the
            requested total: the caller must look at the list).

    Returns:
        PositionalCounts whose totals are the signed sums and whose fingerprint is the XOR
        of the items' (XOR is its own inverse, so subtracting removes a fingerprint).

    Raises:
        CorruptPartialError: a partial does not match its marker (``corrupt`` is None).
    """
    total = _SignedSum(spec, dense=dense)
    for path, sign in items:
        part = _load_item(path, sign, spec, corrupt)
        if part is not None:
            total.add(part, sign)
    return total.result(metadata)


def mark_result(out: str | os.PathLike, summary: dict[str, Any], /) -> None:
    """Write the final sum's completion marker (``done.json``: its counts file, totals and
    SHA-256), like a partial's, so the next incremental refresh checks the total it builds on."""
    marker = {k: summary[k] for k in ("counts_file", "sequences", "windows", "tokens", "fingerprint")}
    write_json_atomic(Path(out) / PARTIAL_MARKER, {**marker, "sha256": file_sha256(Path(out) / summary["counts_file"])})


def reduce_partials(
    items: Sequence[tuple[str | os.PathLike, int]],
    spec: CountSpec,
    out: str | os.PathLike,
    /,
    *,
    dense_budget: int,
    final: bool,
    metadata: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One step of a tree reduce: :func:`sum_partials` of ``items`` saved into ``out``.

    The sum is accumulated dense when ``spec`` fits ``dense_budget``; it is stored as
    :func:`posstats.counting.io.choose_storage` decides (by size, int32 where it fits).

    Returns:
        ``{"path", "counts_file", "sequences", "windows", "tokens", "fingerprint",
        "storage"}`` (+ ``"positions_occupied"`` for the final sum); or, when partials do
        not match their markers, nothing is saved and ``{"corrupt": [{"path", "error",
        "detail"}, ...]}`` is returned.
    """
    corrupt: list[CorruptPartialError] = []
    total = sum_partials(items, spec, dense=spec.fits_dense(dense_budget), metadata=metadata, corrupt=corrupt)
    if corrupt:
        return {"corrupt": [{"path": exc.path, "error": str(exc), "detail": exc.detail} for exc in corrupt]}
    path = save_counts(total, out)
    summary = {
        "path": str(out),
        "counts_file": path.name,
        "sequences": total.sequences,
        "windows": total.windows,
        "tokens": total.tokens,
        "fingerprint": total.fingerprint,
        "storage": "sparse" if path.name == SPARSE_FILE else "dense",
    }
    if final:
        summary["positions_occupied"] = int((total.occupancy() > 0).sum())
        mark_result(out, summary)
    return summary
