"""A small randomly initialised transformer in torch, for measuring what the architecture
alone does to positions (THEORY sections 8 and 9).

torch is an optional extra (``pip install 'posstats[torch]'``) and is imported only inside
the functions here, so importing this module, or ``posstats``, never imports torch.

The model follows NanoGPT (the code base of ``papers/004_*``): token embedding only (no
positional encoding unless ``rope=True``), ``layers`` blocks of multi-head attention and a
GELU MLP (4x wide), each with LayerNorm and a residual connection, in the pre-LN layout
``h = h + attn(LN(h)); h = h + mlp(LN(h))`` by default (``norm="post"`` gives
``h = LN(h + attn(h)); h = LN(h + mlp(h))``). Initialisation follows the paper's
description, "all models are initialized by N(0, sigma)": every linear weight and the
token embedding ~ N(0, init_std^2), biases 0, LayerNorm gain 1 and bias 0.
``scaled_residual_init=True`` instead gives the two projections back into the residual
stream NanoGPT's N(0, (init_std / sqrt(2 layers))^2); that shrinks the attention output
relative to the token embedding and with it the adjacency score of every layer (on 64
real tokens, layer 1 drops from about 0.9 to about 0.6). Everything is drawn from one
``torch.Generator`` seeded with ``seed``, on the CPU, so a config gives the same weights on
every machine.

``hidden_states`` returns the token embeddings and the residual stream after every block
(the paper's "Embeddings, Layer 1, ..., Layer n"); ``input_jacobian_norms`` measures
``||d h_L^(H) / d x_j||_F``, the input-output Jacobian of the last position's final hidden
state with respect to each input embedding (``papers/003_*``, Appendix F, which plots a
one-probe surrogate): exactly, or estimated from a few random probes; ``jacobian_profile``
averages it over seeds for comparison with ``posstats.baselines.influence.cesaro_influence``.

Observed on this implementation (pre-LN, init std 0.02, L = 64-256, H = 4-8): the Jacobian profile
follows ``(N^H)[L, j]`` with Spearman ~0.99 and an effective residual weight a ~0.2-0.3;
RoPE leaves it unchanged at initialisation (attention is near uniform either way).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "RandomTransformer",
    "TransformerConfig",
    "input_jacobian_norms",
    "jacobian_profile",
    "set_torch_threads",
]

_NORMS = ("pre", "post")


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:  # the message is the point: say how to fix it
        msg = "torch is not installed; install the extra: pip install 'posstats[torch]'"
        raise ImportError(msg) from exc
    return torch


def set_torch_threads(threads: int, /) -> None:
    """Set torch's intra-op thread count (process-wide; for command-line entry points).

    The models here are small: on a busy machine one thread is often ten times faster
    than several contending ones. Library functions never change it themselves.
    """
    if threads < 1:
        msg = f"threads must be >= 1; got {threads}"
        raise ValueError(msg)
    _torch().set_num_threads(int(threads))


@dataclass(frozen=True)
class TransformerConfig:
    """Architecture and initialisation of a :class:`RandomTransformer`.

    Defaults are the baseline of ``papers/004_*`` (NanoGPT, 6 layers, 384 dims, 6 heads,
    N(0, 0.02^2) initialisation, causal attention, no positional encoding).

    Attributes:
        layers: number of transformer blocks (>= 0).
        dim: model width d (divisible by ``heads``; head size even when ``rope``).
        heads: attention heads per block.
        vocab_size: rows of the token-embedding table.
        mlp_ratio: hidden width of the MLP as a multiple of ``dim``; 0 drops the MLP.
        init_std: standard deviation of the Gaussian initialisation (0.02 standard).
        causal: causal (lower-triangular) attention; False gives bidirectional attention.
        rope: rotary position embedding on queries and keys (half-split layout).
        rope_base: RoPE base; frequencies ``base^(-2k/head_dim)``.
        norm: ``"pre"`` (GPT-2 / NanoGPT) or ``"post"`` (original Transformer) LayerNorm.
        residual: keep the residual connections (True in every experiment here).
        scaled_residual_init: NanoGPT's ``init_std / sqrt(2 layers)`` for the output
            projections of attention and MLP (off by default, see the module doc).
        seed: seed of the generator drawing all weights.
    """

    layers: int = 6
    dim: int = 384
    heads: int = 6
    vocab_size: int = 32768
    mlp_ratio: int = 4
    init_std: float = 0.02
    causal: bool = True
    rope: bool = False
    rope_base: float = 10000.0
    norm: str = "pre"
    residual: bool = True
    scaled_residual_init: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.layers < 0:
            msg = f"layers must be >= 0; got {self.layers}"
            raise ValueError(msg)
        if self.dim < 1 or self.heads < 1 or self.dim % self.heads:
            msg = f"dim must be a positive multiple of heads; got dim={self.dim}, heads={self.heads}"
            raise ValueError(msg)
        if self.rope and (self.dim // self.heads) % 2:
            msg = f"rope needs an even head size; got dim/heads = {self.dim // self.heads}"
            raise ValueError(msg)
        if self.vocab_size < 1 or self.mlp_ratio < 0:
            msg = f"vocab_size must be >= 1 and mlp_ratio >= 0; got {self.vocab_size}, {self.mlp_ratio}"
            raise ValueError(msg)
        if not (self.init_std > 0 and math.isfinite(self.init_std)):
            msg = f"init_std must be a positive finite number; got {self.init_std}"
            raise ValueError(msg)
        if self.norm not in _NORMS:
            msg = f"norm must be one of {_NORMS}; got {self.norm!r}"
            raise ValueError(msg)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plain values."""
        return dataclasses.asdict(self)


class RandomTransformer:
    """A randomly initialised transformer held as plain torch tensors (no ``nn.Module``).

    Args:
        config: the architecture; the weights are a deterministic function of it.
        dtype: ``"float32"`` or ``"float64"`` (use float64 for Jacobians: the dead zone
            reaches 1e-9 of the peak for deep models).
    """

    def __init__(self, config: TransformerConfig, *, dtype: str = "float32") -> None:
        torch = _torch()
        if dtype not in ("float32", "float64"):
            msg = f"dtype must be 'float32' or 'float64'; got {dtype!r}"
            raise ValueError(msg)
        self.config = config
        self.dtype = getattr(torch, dtype)
        c = config
        gen = torch.Generator().manual_seed(int(c.seed))
        std = float(c.init_std)
        out_std = std / math.sqrt(2 * c.layers) if c.scaled_residual_init and c.layers else std
        hidden = c.mlp_ratio * c.dim

        def normal(*shape: int, scale: float) -> Any:
            # Drawn in float32 whatever the dtype, so float64 models have the same weights.
            return (torch.randn(*shape, generator=gen) * scale).to(self.dtype)

        def zeros(*shape: int) -> Any:
            return torch.zeros(*shape, dtype=self.dtype)

        def ones(*shape: int) -> Any:
            return torch.ones(*shape, dtype=self.dtype)

        self.embedding = normal(c.vocab_size, c.dim, scale=std)
        self.blocks: list[dict[str, Any]] = []
        for _ in range(c.layers):
            block = {
                "ln1_w": ones(c.dim),
                "ln1_b": zeros(c.dim),
                "w_qkv": normal(c.dim, 3 * c.dim, scale=std),
                "b_qkv": zeros(3 * c.dim),
                "w_o": normal(c.dim, c.dim, scale=out_std),
                "b_o": zeros(c.dim),
                "ln2_w": ones(c.dim),
                "ln2_b": zeros(c.dim),
            }
            if hidden:
                block |= {
                    "w_fc": normal(c.dim, hidden, scale=std),
                    "b_fc": zeros(hidden),
                    "w_proj": normal(hidden, c.dim, scale=out_std),
                    "b_proj": zeros(c.dim),
                }
            self.blocks.append(block)

    # -- forward -----------------------------------------------------------------------

    def embed(self, token_ids: Any, /) -> Any:
        """Token embeddings, a tensor (..., n, dim), from integer ids (..., n)."""
        torch = _torch()
        ids = torch.as_tensor(np.asarray(token_ids), dtype=torch.long)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.config.vocab_size):
            msg = (
                f"token ids must lie in [0, {self.config.vocab_size}); "
                f"got range [{int(ids.min())}, {int(ids.max())}]"
            )
            raise ValueError(msg)
        return self.embedding[ids]

    def forward(self, x: Any, /) -> list[Any]:
        """Residual stream before and after every block.

        Args:
            x: input embeddings, a torch tensor (batch, n, dim) or (n, dim).

        Returns:
            ``layers + 1`` tensors shaped like ``x``: the input, then each block's output.
        """
        torch = _torch()
        c = self.config
        squeeze = x.dim() == 2
        h = x[None] if squeeze else x
        n = h.shape[-2]
        rope = self._rope_tables(n) if c.rope else None
        mask = None
        if c.causal:
            mask = torch.ones(n, n, dtype=torch.bool).tril()
        states = [h]
        for block in self.blocks:
            attn_in = self._ln(h, block["ln1_w"], block["ln1_b"]) if c.norm == "pre" else h
            out = self._attention(attn_in, block, mask, rope)
            h = h + out if c.residual else out
            if c.norm == "post":
                h = self._ln(h, block["ln1_w"], block["ln1_b"])
            if "w_fc" in block:
                mlp_in = self._ln(h, block["ln2_w"], block["ln2_b"]) if c.norm == "pre" else h
                hid = torch.nn.functional.gelu(mlp_in @ block["w_fc"] + block["b_fc"])
                out = hid @ block["w_proj"] + block["b_proj"]
                h = h + out if c.residual else out
                if c.norm == "post":
                    h = self._ln(h, block["ln2_w"], block["ln2_b"])
            states.append(h)
        return [s[0] for s in states] if squeeze else states

    def hidden_states(self, token_ids: Any, /) -> np.ndarray:
        """Embeddings and every block's output for token sequences, as numpy float64.

        Args:
            token_ids: integer array (n,) or (batch, n).

        Returns:
            array (layers + 1, n, dim) or (batch, layers + 1, n, dim); index 0 is the
            token embeddings, index l the residual stream after block l.
        """
        torch = _torch()
        ids = np.asarray(token_ids)
        if ids.ndim not in (1, 2):
            msg = f"token_ids must be 1-D or 2-D; got shape {ids.shape}"
            raise ValueError(msg)
        with torch.no_grad():
            states = self.forward(self.embed(ids))
            out = torch.stack(states, dim=-3).to(torch.float64).numpy()
        return out

    # -- pieces ------------------------------------------------------------------------

    @staticmethod
    def _ln(x: Any, w: Any, b: Any) -> Any:
        torch = _torch()
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)

    def _rope_tables(self, n: int) -> tuple[Any, Any]:
        torch = _torch()
        hd = self.config.dim // self.config.heads
        k = torch.arange(hd // 2, dtype=torch.float64)
        theta = self.config.rope_base ** (-2.0 * k / hd)
        ang = torch.arange(n, dtype=torch.float64)[:, None] * theta[None, :]
        return ang.cos().to(self.dtype), ang.sin().to(self.dtype)

    @staticmethod
    def _apply_rope(x: Any, tables: tuple[Any, Any]) -> Any:
        torch = _torch()
        cos, sin = tables
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    def _attention(self, x: Any, block: dict[str, Any], mask: Any, rope: Any) -> Any:
        torch = _torch()
        c = self.config
        b, n, d = x.shape
        hd = d // c.heads
        qkv = x @ block["w_qkv"] + block["b_qkv"]
        q, k, v = (t.reshape(b, n, c.heads, hd).transpose(1, 2) for t in qkv.split(d, dim=-1))
        if rope is not None:
            q, k = self._apply_rope(q, rope), self._apply_rope(k, rope)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        att = torch.softmax(scores, dim=-1)
        z = (att @ v).transpose(1, 2).reshape(b, n, d)
        return z @ block["w_o"] + block["b_o"]


def input_jacobian_norms(
    model: RandomTransformer,
    token_ids: Any,
    /,
    *,
    position: int = -1,
    probes: int | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Frobenius norms of the input-output Jacobian of one position's final hidden state.

    ``rho[j] = || J_j ||_F`` with ``J_j = d h_p^(H) / d x_j`` (dim x dim), for every input
    position j, where ``x_j`` is the input (token) embedding of position j and ``h_p^(H)``
    the residual stream of position ``p = position`` after the last block.

    With ``probes=None`` the norm is exact: all ``dim`` rows of ``J`` come from one batched
    reverse pass (batch of ``dim`` copies, so the cost is ``dim`` forward passes). With
    ``probes=k`` it is estimated from k Gaussian probes u ~ N(0, I):
    ``rho[j]^2 ~= mean_u ||J_j^T u||^2`` (unbiased, since ``E ||J^T u||^2 = ||J||_F^2``),
    k forward passes. ``papers/003_*`` (Appendix F) plots one all-ones probe; at
    initialisation both scale with the Cesaro kernel.

    Args:
        model: the network (float64 recommended).
        token_ids: integer array (n,), one sequence.
        position: the output position p (default the last).
        probes: None for the exact norm, else the number of random probes (>= 1).
        seed: seed of the probe generator.

    Returns:
        float64 array (n,), zero for positions p cannot see (causal, j > p).
    """
    torch = _torch()
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or ids.size == 0:
        msg = f"token_ids must be a non-empty 1-D sequence; got shape {ids.shape}"
        raise ValueError(msg)
    if probes is not None and probes < 1:
        msg = f"probes must be None or >= 1; got {probes}"
        raise ValueError(msg)
    x = model.embed(ids).detach()
    d = x.shape[-1]
    k = d if probes is None else int(probes)
    # Copies in one batch do not interact, so one backward pass of sum_b <u_b, y_b> gives
    # J^T u_b for every copy b: with u_b = e_b these are the rows of J.
    xs = x.expand(k, *x.shape).clone().requires_grad_(True)
    out = model.forward(xs)[-1][:, position, :]  # (k, d)
    if probes is None:
        u = torch.eye(d, dtype=out.dtype)
    else:
        gen = torch.Generator().manual_seed(int(seed))
        u = torch.randn(k, d, generator=gen).to(out.dtype)
    (out * u).sum().backward()
    sq = (xs.grad**2).sum(dim=(0, 2))
    if probes is not None:
        sq = sq / k
    return sq.sqrt().to(torch.float64).numpy()


def jacobian_profile(
    config: TransformerConfig,
    length: int,
    /,
    *,
    seeds: Sequence[int] = (0, 1, 2),
    probes: int | None = None,
    dtype: str = "float64",
) -> np.ndarray:
    """Mean normalised input-output Jacobian norm profile over random models and inputs.

    For each seed s the model ``config`` with ``seed = s`` is run on ``length`` token ids
    drawn uniformly from the vocabulary by ``numpy.random.default_rng(s)``;
    :func:`input_jacobian_norms` of the last position (with ``probes``) is normalised to
    sum 1, and the profiles are averaged over seeds.

    Returns:
        float64 array (length,), index j - 1 for 1-based position j, summing to 1:
        comparable with ``posstats.baselines.influence.cesaro_influence(length, config.layers, ...)``.
    """
    if length < 1:
        msg = f"length must be >= 1; got {length}"
        raise ValueError(msg)
    if not seeds:
        msg = "seeds must not be empty"
        raise ValueError(msg)
    total = np.zeros(length)
    for seed in seeds:
        model = RandomTransformer(dataclasses.replace(config, seed=int(seed)), dtype=dtype)
        rng = np.random.default_rng(int(seed))
        ids = rng.integers(0, config.vocab_size, size=length)
        prof = input_jacobian_norms(model, ids, probes=probes, seed=int(seed))
        total += prof / prof.sum()
    return total / len(seeds)
