"""The encodings catalog: the registry of encoding families, spec strings and
:func:`make_encoding` (THEORY.md section 5).

A family (:class:`Family`) is one module of ``posstats/geometry/encodings/families/``: its
name, its parameters, how it is built, whether it is fitted to the counts (``mds``...) and
what it needs (an MDS result, the distances). :func:`register` adds it here; the package
imports every module of ``families/`` at import, so adding an encoding is adding one file.

Spec grammar: ``NAME(:key=value)*``, one bare value allowed for the first parameter, e.g.
``mds-lowrank:8``, ``random:0.02``, ``rope:layout=half:vector=random``; a ``key=a|b|c``
sweeps (:func:`expand_encoding_specs`). :func:`make_encoding` builds an :class:`Encoding`
named by the canonical spec (defaults left out, the first parameter bare).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posstats.errors import InputError, OptionError, PosstatsError, did_you_mean

__all__ = [
    "ALIASES",
    "DEFAULT_MAX_ENCODINGS",
    "FAMILIES",
    "REQUIRED",
    "Encoding",
    "EncodingSpec",
    "Family",
    "Inputs",
    "Param",
    "as_positions",
    "bool_param",
    "check_dim",
    "check_encoding_count",
    "check_positive",
    "choice",
    "count_encoding_specs",
    "encoding_dims",
    "encoding_names",
    "encoding_sweeps",
    "expand_encoding_specs",
    "family_of",
    "fitted_names",
    "frequencies",
    "float_param",
    "floats_param",
    "int_param",
    "make_encoding",
    "pad_columns",
    "parse_encoding_spec",
    "register",
    "seed_param",
    "split_encoding_list",
    "str_param",
]


# ---------------------------------------------------------------------------------------
# Argument checks shared by the families


def as_positions(positions: Any) -> np.ndarray:
    """``positions`` as a 1-D int64 array of non-negative indices (an int n -> arange(n))."""
    if isinstance(positions, (int, np.integer)) and not isinstance(positions, bool):
        if positions < 0:
            msg = f"the number of positions must be >= 0, got {positions}"
            raise ValueError(msg)
        return np.arange(int(positions), dtype=np.int64)
    pos = np.asarray(positions)
    if pos.ndim != 1:
        msg = f"positions must be 1-D; got shape {pos.shape}"
        raise ValueError(msg)
    if pos.size == 0:
        return np.zeros(0, dtype=np.int64)
    if not np.issubdtype(pos.dtype, np.integer):
        msg = f"positions must be integers (0-based sequence indices); got dtype {pos.dtype}"
        raise ValueError(msg)
    pos = pos.astype(np.int64)
    if pos.min() < 0:
        msg = f"positions must be >= 0; got {int(pos.min())}"
        raise ValueError(msg)
    return pos


def check_dim(dim: Any, name: str, *, even: bool = False) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        msg = f"{name}: dimension must be an integer, got {dim!r}"
        raise InputError(msg)
    if dim < 1:
        msg = f"{name}: dimension must be >= 1, got {dim}"
        raise InputError(msg)
    if even and dim % 2:
        msg = f"{name} needs an even dimension, got {dim}"
        raise InputError(msg)
    return int(dim)


def check_positive(value: float, what: str) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        msg = f"{what} must be a positive number, got {value}"
        raise InputError(msg)
    return value


def pad_columns(matrix: np.ndarray, dim: int) -> np.ndarray:
    """First ``dim`` columns of ``matrix`` as float64, zero-padded on the right to ``dim``."""
    out = np.zeros((matrix.shape[0], dim), dtype=np.float64)
    k = min(dim, matrix.shape[1])
    out[:, :k] = matrix[:, :k]
    return out


def frequencies(dim: int, base: float) -> np.ndarray:
    """The angular frequencies ``w_k = base^(-2k/dim)``, k < dim/2, of sinusoidal and RoPE."""
    return base ** (-2.0 * np.arange(dim // 2, dtype=np.float64) / dim)


# ---------------------------------------------------------------------------------------
# Parameter kinds


REQUIRED = object()


@dataclass(frozen=True)
class Param:
    name: str
    kind: Callable[[str], Any]
    default: Any


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            msg = f"expected one of {', '.join(allowed)}"
            raise ValueError(msg)
        return text

    parse.__name__ = "one of " + "/".join(allowed)
    return parse


def int_param(text: str) -> int:
    return int(text)


def seed_param(text: str) -> int:
    value = int(text)
    if not 0 <= value < 2**63:
        msg = "expected a seed in [0, 2^63)"
        raise ValueError(msg)
    return value


def float_param(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        msg = "expected a finite number"
        raise ValueError(msg)
    return value


def bool_param(text: str) -> bool:
    lowered = text.lower()
    if lowered not in ("true", "false", "1", "0"):
        msg = "expected true or false"
        raise ValueError(msg)
    return lowered in ("true", "1")


def floats_param(text: str) -> tuple[float, ...]:
    """``1.0;1.5;2`` -> (1.0, 1.5, 2.0): a list value (LongRoPE's per-pair factors)."""
    return tuple(float_param(x) for x in text.split(";") if x.strip())


def str_param(text: str) -> str:
    if not text:
        msg = "expected a non-empty value"
        raise ValueError(msg)
    return text

# ---------------------------------------------------------------------------------------
# The registry


@dataclass(frozen=True)
class Inputs:
    """What :func:`make_encoding` was given besides the positions and the width.

    Attributes:
        mds: an MDS result (``.encoding``, one row per position) for the fitted families.
        distances: (n, n) Hellinger distances d_H between the positions.
        occupancy: (n,) tokens counted per position.
        context: the sequence length the positions come from (RoPE variants whose
            frequencies depend on it).
    """

    mds: Any = None
    distances: Any = None
    occupancy: Any = None
    context: int | None = None


Built = np.ndarray | tuple[np.ndarray, dict[str, Any]]


@dataclass(frozen=True)
class Family:
    """One encoding family of the catalog.

    Attributes:
        name: the spec's head (``rope``).
        params: its parameters in canonical order; the first one may be given bare.
        build: ``(spec, positions (n,) int64, dim, inputs) -> matrix (n, dim)`` or
            ``(matrix, details)`` (details JSON-ready: how it was fitted).
        order: where the name is listed (``--help``, error messages).
        fitted: built from the counts (an MDS): graded on held-out halves, and a "best
            encoding" of this kind says which fixed encoding comes closest.
        needs: what :func:`make_encoding` must be given: ``"mds"``, ``"distances"``.
        quadratic: costs O(m^2) per iteration: left out above ``AnalysisConfig.smacof_limit``.
        check: ``(spec, dim) -> None`` run first (raises on a bad combination).
        widths: ``(spec, dims) -> widths`` it is scored at (default: ``dims``).
        key_aliases: other spellings of parameter keys (Hugging Face names).
        aliases: other names with preset parameters (``rope-half`` -> ``layout=half``).
    """

    name: str
    params: tuple[Param, ...]
    build: Callable[[EncodingSpec, np.ndarray, int, Inputs], Built]
    order: int
    fitted: bool = False
    needs: frozenset[str] = frozenset()
    quadratic: bool = False
    check: Callable[[EncodingSpec, int], None] | None = None
    widths: Callable[[EncodingSpec, tuple[int, ...]], tuple[int, ...]] | None = None
    key_aliases: Mapping[str, str] = field(default_factory=dict)
    aliases: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


FAMILIES: dict[str, Family] = {}
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {}


def register(family: Family, /) -> Family:
    """Add ``family`` (and its aliases) to the catalog; a name is registered once."""
    taken = [n for n in (family.name, *family.aliases) if n in FAMILIES or n in ALIASES]
    if taken:
        msg = f"encoding name {taken[0]!r} is registered twice"
        raise ValueError(msg)
    FAMILIES[family.name] = family
    for alias, preset in family.aliases.items():
        ALIASES[alias] = (family.name, dict(preset))
    return family


def encoding_names() -> tuple[str, ...]:
    """Every name a spec may start with: the families in their order, then the aliases."""
    return (*sorted(FAMILIES, key=lambda n: FAMILIES[n].order), *ALIASES)


def fitted_names() -> tuple[str, ...]:
    """The families fitted to the counts (``mds``, ``mds-lowrank``, ``mds-smacof``)."""
    return tuple(n for n in encoding_names() if n in FAMILIES and FAMILIES[n].fitted)


def family_of(spec: str | EncodingSpec, /) -> Family:
    """The family a spec belongs to."""
    parsed = spec if isinstance(spec, EncodingSpec) else parse_encoding_spec(spec)
    return FAMILIES[parsed.name]


# ---------------------------------------------------------------------------------------
# Spec strings


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        text = repr(value)
        return text[:-2] if text.endswith(".0") else text
    if isinstance(value, tuple):
        return ";".join(_format(v) for v in value)
    return str(value)


_KEY_START = re.compile(r"\s*[A-Za-z_]\w*\s*=")


def _spec_tokens(text: str) -> list[str]:
    """Split a spec's parameters on ``:``, and on ``,`` where a ``key=`` follows (so
    ``rope:type=yarn,factor=32`` reads like ``rope:type=yarn:factor=32`` while a path with a
    comma stays whole)."""
    tokens: list[str] = []
    for piece in text.split(":"):
        parts = piece.split(",")
        tokens.append(parts[0])
        for part in parts[1:]:
            if _KEY_START.match(part):
                tokens.append(part)
            else:
                tokens[-1] += "," + part
    return tokens


@dataclass(frozen=True)
class EncodingSpec:
    """A parsed encoding spec: the catalog name and all its parameters (defaults filled in)."""

    name: str
    params: Mapping[str, Any]

    @property
    def canonical(self) -> str:
        """The spec string: the first parameter bare when set, then other non-default ones."""
        parts = [self.name]
        for i, p in enumerate(FAMILIES[self.name].params):
            value = self.params[p.name]
            if p.default is not REQUIRED and value == p.default:
                continue
            parts.append(_format(value) if i == 0 else f"{p.name}={_format(value)}")
        return ":".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": dict(self.params), "canonical": self.canonical}


def parse_encoding_spec(spec: str, /) -> EncodingSpec:
    """Parse ``NAME(:key=value)*`` (one bare value allowed, for the first parameter).

    >>> parse_encoding_spec("mds-lowrank:8").params["rank"]
    8
    >>> parse_encoding_spec("rope-half").canonical
    'rope:layout=half'

    Raises:
        PosstatsError: unknown name (the message lists the valid ones), unknown or repeated
            key, two bare values, a value of the wrong type, a missing required value.
    """
    if not isinstance(spec, str) or not spec.strip():
        msg = f"empty encoding spec {spec!r}; valid names: {', '.join(encoding_names())}"
        raise PosstatsError(msg)
    text = spec.strip()
    head, *tokens = _spec_tokens(text)
    name = head.strip().lower()
    preset: dict[str, Any] = {}
    if name in ALIASES:
        name, preset = ALIASES[name]
    if name not in FAMILIES:
        msg = (f"unknown encoding {head!r} in {spec!r}{did_you_mean(head, encoding_names())}; "
               f"valid names: {', '.join(encoding_names())}")
        raise PosstatsError(msg)
    params = FAMILIES[name].params
    by_name = {p.name: p for p in params}
    aliases = FAMILIES[name].key_aliases
    raw: dict[str, str] = {}
    bare: list[str] = []
    for token in tokens:
        key, sep, value = token.partition("=")
        key = aliases.get(key.strip(), key) if sep else key
        if sep and key.strip() in by_name:
            key = key.strip()
            if key in raw:
                msg = f"encoding spec {spec!r}: {key} given twice"
                raise PosstatsError(msg)
            raw[key] = value
        elif sep and key.strip().isidentifier():
            allowed = ", ".join(by_name) or "none"
            msg = f"encoding spec {spec!r}: {name} has no parameter {key.strip()!r} (parameters: {allowed})"
            raise PosstatsError(msg)
        else:
            bare.append(token)
    if bare:
        if not params:
            msg = f"encoding spec {spec!r}: {name} takes no parameters"
            raise PosstatsError(msg)
        first = params[0].name
        if len(bare) > 1 and params[0].kind is not str_param:
            msg = f"encoding spec {spec!r}: only one bare value is allowed (the {first})"
            raise PosstatsError(msg)
        if first in raw:
            msg = f"encoding spec {spec!r}: {first} given twice"
            raise PosstatsError(msg)
        # A path may itself contain ':' (e.g. a Windows drive): rejoin the bare pieces.
        raw[first] = ":".join(bare)
    values: dict[str, Any] = {}
    for p in params:
        if p.name in raw:
            try:
                values[p.name] = p.kind(raw[p.name].strip())
            except ValueError as exc:
                msg = f"encoding spec {spec!r}: bad {p.name} {raw[p.name]!r} ({exc})"
                raise PosstatsError(msg) from None
        elif p.name in preset:
            values[p.name] = preset[p.name]
        elif p.default is REQUIRED:
            msg = f"encoding spec {spec!r}: {name} needs a {p.name}, e.g. {name}:{'8' if p.kind is int_param else 'VALUE'}"
            raise PosstatsError(msg)
        else:
            values[p.name] = p.default
    return EncodingSpec(name, values)


def split_encoding_list(text: str) -> tuple[str, ...]:
    """A comma-separated list of specs, where a ``key=value`` piece continues the spec
    before it: ``"mds,rope:type=yarn,factor=32,sinusoidal"`` ->
    ``("mds", "rope:type=yarn,factor=32", "sinusoidal")``."""
    specs: list[str] = []
    for piece in text.split(","):
        if specs and _KEY_START.match(piece):
            specs[-1] += "," + piece
        elif piece.strip():
            specs.append(piece.strip())
    return tuple(specs)


def _sweep_axes(spec: str) -> tuple[str, list[list[str]]]:
    """A spec's head and, per parameter token, its alternatives (``factor=8|16`` ->
    ``["factor=8", "factor=16"]``; a bare ``0.02|1`` -> ``["0.02", "1"]``)."""
    head, *tokens = _spec_tokens(spec.strip())
    axes = []
    for token in tokens:
        key, sep, value = token.partition("=")
        options = value.split("|") if sep else token.split("|")
        if any(not o.strip() for o in options):
            msg = f"encoding spec {spec!r}: empty value in the sweep {token!r}"
            raise PosstatsError(msg)
        axes.append([f"{key}={o}" if sep else o for o in options])
    return head, axes


DEFAULT_MAX_ENCODINGS = 256


def count_encoding_specs(specs: Any) -> int:
    """How many specs :func:`expand_encoding_specs` gives at most (before duplicates are
    dropped), computed from the sweeps' sizes without expanding them: a sweep of three
    keys with 100 values each is 1,000,000 specs, counted in microseconds."""
    total = 0
    for spec in specs:
        total += math.prod(len(axis) for axis in _sweep_axes(spec)[1]) if "|" in spec else 1
    return total


def check_encoding_count(specs: Any, /, *, limit: int = DEFAULT_MAX_ENCODINGS) -> int:
    """The number of specs ``specs`` expand to; raise when above ``limit``.

    Raises:
        OptionError: ``"encodings expands to 8,000 encodings, more than the limit of
            256 ..."`` (one line, with how to raise the limit; the command line names
            ``--encodings`` and ``--max-encodings``).
    """
    if int(limit) < 1:
        msg = f"the limit on scored encodings must be >= 1, got {limit}"
        raise PosstatsError(msg)
    n = count_encoding_specs(specs)
    if n > limit:
        msg = (f"{{encodings}} expands to {n:,} encodings (sweeps multiply: a|b|c per key), more than the limit of "
               f"{int(limit):,} one run scores; each costs a table and a stress per width. Narrow the sweep, or "
               "raise the limit with {max_encodings}")
        raise OptionError(msg)
    return n


def expand_encoding_specs(specs: Any) -> tuple[str, ...]:
    """Specs with sweeps expanded, duplicates dropped, order kept: a parameter written
    ``key=a|b|c`` gives one spec per value (several swept keys: every combination), e.g.
    ``rope:type=yarn,original=4096,factor=8|16|32`` -> three ``rope:type=yarn:...`` specs.
    A spec without a sweep is kept as written; each sweep member is a canonical spec.
    """
    out: dict[str, None] = {}
    for spec in specs:
        if "|" not in spec:
            parse_encoding_spec(spec)
            out.setdefault(spec.strip())
            continue
        head, axes = _sweep_axes(spec)
        for combo in itertools.product(*axes):
            out.setdefault(parse_encoding_spec(":".join((head, *combo))).canonical)
    return tuple(out)


def encoding_sweeps(specs: Any) -> list[dict[str, Any]]:
    """The sweeps among ``specs`` (JSON-ready), for the report's stress-against-parameter figure.

    One entry per spec with a ``|``: ``spec`` (as written), ``name``, ``parameter`` (the first
    swept key, canonical), ``values`` (its value per member), ``members`` (canonical specs, in
    sweep order), and ``others`` (per member, the other swept keys' values, or {}).
    """
    sweeps = []
    for spec in specs:
        if "|" not in spec:
            continue
        head, axes = _sweep_axes(spec)
        swept = [i for i, axis in enumerate(axes) if len(axis) > 1]
        members = [parse_encoding_spec(":".join((head, *combo))) for combo in itertools.product(*axes)]
        if not swept:
            continue
        first = members[0]
        keys = []
        for i in swept:  # which canonical parameter each swept token sets
            key, sep, _ = axes[i][0].partition("=")
            keys.append(FAMILIES[first.name].key_aliases.get(key.strip(), key.strip()) if sep else FAMILIES[first.name].params[0].name)
        sweeps.append(
            {
                "spec": spec,
                "name": first.name,
                "parameter": keys[0],
                "values": [_json_value(m.params[keys[0]]) for m in members],
                "members": [m.canonical for m in members],
                "others": [{k: _json_value(m.params[k]) for k in keys[1:]} for m in members],
            }
        )
    return sweeps


def _json_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class Encoding:
    """An encoding matrix and the canonical spec that built it.

    Attributes:
        name: canonical spec string (see :func:`parse_encoding_spec`).
        matrix: float64 (len(positions) x dim).
        details: how it was fitted, JSON-ready (``mds-smacof``: classical and refined
            stress, iterations, convergence, seconds); empty for closed-form encodings.
    """

    name: str
    matrix: np.ndarray
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Name and shape only (the matrix itself goes to safetensors, not JSON)."""
        return {"name": self.name, "shape": [int(s) for s in self.matrix.shape]}


def make_encoding(
    spec: str | EncodingSpec,
    positions: Any,
    /,
    dim: int,
    *,
    mds: Any = None,
    distances: Any = None,
    occupancy: Any = None,
    context: int | None = None,
) -> Encoding:
    """Build the encoding named by ``spec`` at ``positions`` with ``dim`` columns.

    Args:
        spec: a spec string (see the module docstring) or a parsed :class:`EncodingSpec`.
        positions: 0-based sequence positions of the rows (the occupied ones), or an int n.
        dim: number of columns (the model width).
        mds: an MDS result (``.encoding``, one row per position) for the fitted families.
        distances: (n, n) Hellinger distances d_H between the positions (``mds-smacof``).
        occupancy: (n,) tokens counted per position (``mds-smacof:weights=occupancy``).
        context: the sequence length the positions come from (the counts' n); RoPE variants
            whose frequencies depend on it (dynamic NTK, LongRoPE) are built for a sequence
            of this length unless the spec gives ``seq_len``. Default: ``max(positions) + 1``.

    Raises:
        PosstatsError: unknown name, bad parameter values (odd dim for sinusoidal/rope,
            dim < 1, rank outside 1..dim, heads > dim, sigma <= 0), a missing MDS result,
            unreadable files.
    """
    parsed = spec if isinstance(spec, EncodingSpec) else parse_encoding_spec(spec)
    family = FAMILIES[parsed.name]
    dim = check_dim(dim, parsed.name)
    pos = as_positions(positions)
    if family.check is not None:
        family.check(parsed, dim)
    if "mds" in family.needs:
        if mds is None:
            msg = f"encoding {parsed.canonical!r} needs an MDS result (pass mds=...)"
            raise PosstatsError(msg)
        rows = np.shape(getattr(mds, "encoding", None))
        if len(rows) != 2 or rows[0] != pos.shape[0]:
            msg = f"encoding {parsed.canonical!r}: the MDS result has shape {rows}, but there are {pos.shape[0]} positions"
            raise PosstatsError(msg)
    if "distances" in family.needs and distances is None:
        msg = f"encoding {parsed.canonical!r} needs the Hellinger distances (pass distances=...)"
        raise PosstatsError(msg)
    built = family.build(parsed, pos, dim, Inputs(mds, distances, occupancy, context))
    matrix, details = built if isinstance(built, tuple) else (built, {})
    return Encoding(parsed.canonical, matrix, details)


def encoding_dims(spec: str | EncodingSpec, dims: Any) -> tuple[int, ...]:
    """The widths an encoding is scored at: ``dims``, except for families that fix their
    own (``hf:`` specs, scored at their model's head dimension only)."""
    parsed = spec if isinstance(spec, EncodingSpec) else parse_encoding_spec(spec)
    widths = tuple(int(d) for d in dims)
    family = FAMILIES[parsed.name]
    return family.widths(parsed, widths) if family.widths is not None else widths
