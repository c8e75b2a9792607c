"""Self-cosine-similarity matrices and the adjacency probability score (THEORY section 9).

For vectors X (n x d) (an encoding, or the hidden states of a model at one layer):

    Cs[i, j] = cos(X_i, X_j)                                   (self-cosine similarity)
    P_k      = #{(i, j) : 0 <= i < j < k, Cs[k, i] < Cs[k, j]} / C(k, 2)   (row score)
    P        = mean of P_k over the rows k >= 2 (the rows with at least one pair)

P_k is the probability that, looking back from position k, the nearer of two earlier
positions is the more similar. About 0.5 means no positional signal, near 1 a strong
adjacency pattern. The comparison is strict: ties count as "not adjacent", so a constant
row scores 0 (``papers/004_*`` notes a score near 0 is unreachable unless all embeddings
are equal).

The score is computed exactly in O(n^2 log n) per matrix: row k needs the number of
strictly increasing pairs in ``Cs[k, :k]``, which a Fenwick (binary indexed) tree over the
row's value ranks counts in O(k log k); the n trees are advanced together, one column at
a time, so the Python loop runs n times and each step is a vectorised numpy operation
(n = 1024: well under a second; memory 8 n^2 bytes for the trees).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "AdjacencyResult",
    "LayerAdjacency",
    "adjacency",
    "adjacency_score",
    "increasing_pair_counts",
    "layer_adjacency",
    "plot_similarity_matrices",
    "row_adjacency_scores",
    "self_cosine_similarity",
]


def self_cosine_similarity(x: Any, /) -> np.ndarray:
    """Cosine similarity between every pair of rows of ``x``.

    ``Cs[i, j] = <x_i, x_j> / (|x_i| |x_j|)``, computed in float64 and clipped to [-1, 1].
    A zero row has no direction: its similarity to every row, itself included, is 0 (so
    e.g. position 0 of ALiBi, ``p_0 = 0``, is "unlike" everything rather than NaN).

    Args:
        x: array (n, d) of finite real numbers (numpy, cupy or a CPU torch tensor).

    Returns:
        float64 numpy array (n, n), symmetric, diagonal 1 for non-zero rows. A cupy or
        torch input is copied to the host: the score below is a CPU algorithm, and n is
        at most a few thousand here.

    Example:
        >>> self_cosine_similarity(np.array([[1.0, 0.0], [1.0, 1.0]])).round(3)
        array([[1.   , 0.707],
               [0.707, 1.   ]])
    """
    arr = _as_float64(x)
    if arr.ndim != 2:
        msg = f"x must be 2-D (positions, dim); got shape {arr.shape}"
        raise ValueError(msg)
    if not np.isfinite(arr).all():
        msg = "x contains NaN or infinite values"
        raise ValueError(msg)
    norms = np.linalg.norm(arr, axis=1)
    nonzero = norms > 0
    unit = np.zeros_like(arr)
    unit[nonzero] = arr[nonzero] / norms[nonzero, None]
    cs = unit @ unit.T
    np.clip(cs, -1.0, 1.0, out=cs)
    # Pin the diagonal: rounding can leave 1 - 1e-16, which matters for exact ties.
    idx = np.flatnonzero(nonzero)
    cs[idx, idx] = 1.0
    return cs


def increasing_pair_counts(cs: Any, /) -> np.ndarray:
    """Per row k, the number of pairs ``0 <= i < j < k`` with ``cs[k, i] < cs[k, j]``.

    Args:
        cs: array (n, n) (only the strictly lower triangle is read).

    Returns:
        int64 array (n,); entries 0 and 1 are always 0.
    """
    arr = _as_float64(cs)
    if arr.ndim != 2 or arr.shape[0] != arr.shape[1]:
        msg = f"cs must be a square matrix; got shape {arr.shape}"
        raise ValueError(msg)
    n = arr.shape[0]
    counts = np.zeros(n, dtype=np.int64)
    if n < 3:
        return counts
    if np.isnan(arr).any():
        msg = "cs contains NaN values"
        raise ValueError(msg)
    # Dense 1-based ranks of each row's values (equal values share a rank), so that
    # "value < v" is "rank < rank(v)": a prefix count in a Fenwick tree.
    order = np.argsort(arr, axis=1, kind="stable")
    sorted_vals = np.take_along_axis(arr, order, axis=1)
    new_value = np.ones_like(sorted_vals, dtype=np.int64)
    new_value[:, 1:] = sorted_vals[:, 1:] != sorted_vals[:, :-1]
    dense = np.cumsum(new_value, axis=1)
    ranks = np.empty_like(dense)
    np.put_along_axis(ranks, order, dense, axis=1)

    # One Fenwick tree per row, stored flat; column 0 stays 0 (queries end there) and
    # column n + 1 is a sink for updates that run past n (never read), so the inner loops
    # need no masks.
    width = n + 2
    tree = np.zeros(n * width, dtype=np.int64)
    steps = n.bit_length() + 1
    for j in range(n - 1):
        rows = np.arange(j + 1, n)  # rows k > j use column j
        base = rows * width
        r = ranks[rows, j]
        idx = r - 1  # count the ranks < r among columns 0..j-1
        acc = np.zeros(rows.size, dtype=np.int64)
        for _ in range(steps):
            acc += tree[base + idx]
            idx -= idx & -idx
        counts[rows] += acc
        idx = r.copy()  # then insert rank r
        for _ in range(steps):
            tree[base + idx] += 1  # one index per row: no duplicates within a step
            idx = np.minimum(idx + (idx & -idx), n + 1)
    return counts


def row_adjacency_scores(cs: Any, /) -> np.ndarray:
    """Row-wise adjacency probability scores ``P_k`` of a similarity matrix.

    ``P_k = #{0 <= i < j < k : cs[k, i] < cs[k, j]} / C(k, 2)`` (strict: ties are not
    adjacent). Rows 0 and 1 have no pair and are NaN.

    Args:
        cs: array (n, n), e.g. from :func:`self_cosine_similarity`.

    Returns:
        float64 array (n,) in [0, 1], NaN for k < 2.
    """
    counts = increasing_pair_counts(cs)
    n = counts.shape[0]
    k = np.arange(n, dtype=np.float64)
    pairs = k * (k - 1) / 2
    scores = np.full(n, np.nan)
    scores[2:] = counts[2:] / pairs[2:]
    return scores


def adjacency_score(cs: Any, /) -> float:
    """Adjacency probability score: the mean of :func:`row_adjacency_scores` over k >= 2.

    Returns NaN for a matrix with fewer than 3 rows (no row has a pair).

    Example:
        >>> cs = -np.abs(np.subtract.outer(np.arange(5.0), np.arange(5.0)))
        >>> adjacency_score(cs), adjacency_score(-cs)
        (1.0, 0.0)
    """
    rows = row_adjacency_scores(cs)
    if rows.shape[0] < 3:
        return float("nan")
    return float(np.mean(rows[2:]))


@dataclass(frozen=True)
class AdjacencyResult:
    """Self-cosine similarity and adjacency score of one matrix of vectors.

    Attributes:
        name: a label (encoding name, "layer 3", ...).
        similarity: float64 (n, n) self-cosine-similarity matrix.
        row_scores: float64 (n,) row scores, NaN for rows 0 and 1.
        score: the matrix's adjacency probability score.
    """

    name: str
    similarity: np.ndarray
    row_scores: np.ndarray
    score: float

    def to_dict(self, *, include_matrix: bool = False) -> dict[str, Any]:
        """JSON-ready values; the n x n matrix only when asked (it can be large)."""
        out: dict[str, Any] = {
            "name": self.name,
            "n": int(self.similarity.shape[0]),
            "score": _json_float(self.score),
            "row_scores": [_json_float(v) for v in self.row_scores],
        }
        if include_matrix:
            out["similarity"] = self.similarity.tolist()
        return out


def adjacency(x: Any, /, *, name: str = "") -> AdjacencyResult:
    """Self-cosine similarity of the rows of ``x`` (n x d) and its adjacency score."""
    cs = self_cosine_similarity(x)
    rows = row_adjacency_scores(cs)
    score = float(np.mean(rows[2:])) if rows.shape[0] >= 3 else float("nan")
    return AdjacencyResult(name=name, similarity=cs, row_scores=rows, score=score)


@dataclass(frozen=True)
class LayerAdjacency:
    """Adjacency scores of hidden states, layer by layer, over several sequences.

    Attributes:
        names: one label per layer (``"embeddings"``, ``"layer 1"``, ...).
        scores: float64 (sequences, layers) adjacency score of each sequence at each layer.
        mean, std: float64 (layers,) mean and population standard deviation over sequences.
        example: float64 (layers, n, n) self-cosine-similarity matrices of sequence 0 (the
            paper shows one sample; its scores are ``scores[0]``).
    """

    names: tuple[str, ...]
    scores: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    example: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values (without the example matrices)."""
        return {
            "sequences": int(self.scores.shape[0]),
            "layers": [
                {
                    "name": name,
                    "mean": _json_float(self.mean[i]),
                    "std": _json_float(self.std[i]),
                    "per_sequence": [_json_float(v) for v in self.scores[:, i]],
                }
                for i, name in enumerate(self.names)
            ],
        }


def layer_adjacency(hidden_states: Any, /, *, names: Sequence[str] | None = None) -> LayerAdjacency:
    """Adjacency score of every layer's hidden states for every sequence.

    Args:
        hidden_states: array (sequences, layers, n, d) or (layers, n, d), e.g. from
            ``posstats.baselines.random_transformer.RandomTransformer.hidden_states``.
        names: labels of the layers; default ``"embeddings", "layer 1", ...``.

    Returns:
        a :class:`LayerAdjacency`.
    """
    hs = _as_float64(hidden_states)
    if hs.ndim == 3:
        hs = hs[None]
    if hs.ndim != 4 or hs.shape[0] == 0 or hs.shape[1] == 0:
        msg = f"hidden_states must be (sequences, layers, n, d); got shape {hs.shape}"
        raise ValueError(msg)
    n_seq, n_layers = hs.shape[:2]
    if names is None:
        names = ["embeddings"] + [f"layer {i}" for i in range(1, n_layers)]
    if len(names) != n_layers:
        msg = f"got {len(names)} names for {n_layers} layers"
        raise ValueError(msg)
    scores = np.empty((n_seq, n_layers))
    example = np.empty((n_layers, hs.shape[2], hs.shape[2]))
    for s in range(n_seq):
        for layer in range(n_layers):
            cs = self_cosine_similarity(hs[s, layer])
            scores[s, layer] = adjacency_score(cs)
            if s == 0:
                example[layer] = cs
    return LayerAdjacency(
        names=tuple(names),
        scores=scores,
        mean=scores.mean(axis=0),
        std=scores.std(axis=0),
        example=example,
    )


def plot_similarity_matrices(
    matrices: Sequence[np.ndarray],
    titles: Sequence[str],
    /,
    *,
    columns: int = 4,
    suptitle: str | None = None,
) -> Any:
    """A grid of self-cosine-similarity heatmaps, one panel per matrix.

    matplotlib is imported here, with the Agg canvas, so the library never needs a display
    and importing posstats never imports matplotlib.

    Args:
        matrices: square arrays with values in [-1, 1].
        titles: one title per matrix (e.g. ``"layer 1 (0.93)"``).
        columns: panels per row.
        suptitle: optional figure title.

    Returns:
        a ``matplotlib.figure.Figure`` (save it with ``fig.savefig(path)``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if len(matrices) != len(titles):
        msg = f"got {len(matrices)} matrices but {len(titles)} titles"
        raise ValueError(msg)
    if not matrices:
        msg = "no matrices to plot"
        raise ValueError(msg)
    cols = max(1, min(columns, len(matrices)))
    rows = math.ceil(len(matrices) / cols)
    fig = Figure(figsize=(3.0 * cols + 1.0, 3.0 * rows + (0.4 if suptitle else 0.0)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    image = None
    for ax, mat, title in zip(axes.flat, matrices, titles):
        image = ax.imshow(np.asarray(mat), cmap="viridis", vmin=-1.0, vmax=1.0, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("position j", fontsize=8)
        ax.set_ylabel("position i", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(matrices) :]:
        ax.set_axis_off()
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8, label="cos(x_i, x_j)")
    if suptitle:
        fig.suptitle(suptitle)
    return fig


def _as_float64(x: Any) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch
        x = x.detach().cpu().numpy()
    elif type(x).__module__.split(".", 1)[0] == "cupy":
        x = x.get()
    return np.asarray(x, dtype=np.float64)


def _json_float(v: float) -> float | None:
    v = float(v)
    return v if math.isfinite(v) else None
