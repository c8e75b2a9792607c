"""Batches of token-id sequences: the unit that readers produce and counting consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from posstats.errors import InputError

__all__ = ["TokenBatch"]


@dataclass(frozen=True)
class TokenBatch:
    """A batch of token-id sequences in CSR layout (Arrow's list<int> layout).

    Sequence ``r`` is ``values[offsets[r]:offsets[r + 1]]``.

    Attributes:
        values: int32 or int64, shape (total_tokens,) (readers keep int32 ids as stored).
        offsets: int64, shape (rows + 1,), non-decreasing, ``offsets[0] == 0``,
            ``offsets[-1] == len(values)``.
        source: where the batch came from (a file path), for error messages.
        first_row: row number (0-based) in ``source`` of the batch's first sequence.
    """

    values: np.ndarray
    offsets: np.ndarray
    source: str = "<memory>"
    first_row: int = 0

    @property
    def rows(self) -> int:
        """Number of sequences in the batch."""
        return len(self.offsets) - 1

    @classmethod
    def from_sequences(cls, sequences, /, *, source: str = "<memory>", first_row: int = 0) -> TokenBatch:
        """Build a batch from an iterable of integer sequences (lists or 1-D arrays).

        >>> TokenBatch.from_sequences([[5, 6], [7]]).offsets.tolist()
        [0, 2, 3]
        """
        seqs = [np.asarray(s) for s in sequences]
        lengths = np.fromiter((s.size for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        for r, s in enumerate(seqs):
            if s.ndim != 1 or (s.size and not np.issubdtype(s.dtype, np.integer)):
                msg = f"{source}: row {first_row + r}: expected a list of integer token ids, got {s.tolist()!r:.80}"
                raise InputError(msg)
        values = np.concatenate(seqs).astype(np.int64, copy=False) if seqs else np.zeros(0, np.int64)
        return cls(values, offsets, source, first_row)

    def row_of(self, index: int, /) -> int:
        """Source row number holding ``values[index]``."""
        return self.first_row + int(np.searchsorted(self.offsets, index, side="right")) - 1
