"""The catalog of positional encodings compared against the corpus (THEORY.md section 5).

Every constructor returns a float64 numpy array of shape ``(len(positions), dim)``: row r
is the encoding of the 0-based sequence position ``positions[r]``. Geometry works on the
*occupied* positions only, so ``positions`` is usually the list of occupied rows; an int
``n`` means ``arange(n)``.

| spec | family module | parameters (first one may be given bare) |
|---|---|---|
| ``mds`` | ``families/mds.py`` (fitted) | (needs an MDS result) |
| ``mds-lowrank:R`` | ``families/mds.py`` (fitted) | ``rank`` (required) |
| ``mds-smacof`` | ``families/mds.py`` (fitted) | ``rank`` = dim, ``weights`` = uniform/occupancy/local, ``scale`` = 1, ``max_iter`` = 300, ``tol`` = 1e-6 (needs an MDS result and the distances) |
| ``sinusoidal`` | ``families/fixed.py`` | ``base`` = 10000 |
| ``rope`` | ``families/rope.py`` | ``base`` = 10000, ``type`` (scaling), ``layout`` = interleaved/half, ``vector`` = ones/random, ``seed`` = 0 |
| ``rope-half`` | alias of ``rope:layout=half`` | |
| ``hf:PATH`` | ``families/rope.py`` | a model config's RoPE at its head_dim |
| ``alibi`` | ``families/fixed.py`` | ``heads`` = min(dim, 8) |
| ``random`` | ``families/fixed.py`` | ``sigma`` = 1, ``seed`` = 0 |
| ``learned:PATH`` | ``families/learned.py`` | ``path`` (required), ``key`` |
| ``matrix-power:PATH`` | ``families/fixed.py`` | ``path`` (required, safetensors with tensors ``M`` and ``x``) |

Adding an encoding is one file: a module in ``families/`` that calls
:func:`~posstats.geometry.encodings.catalog.register` with its :class:`Family` (name,
parameters, how it is built, whether it is fitted to the counts, what it needs). Every
module of ``families/`` is imported here, in name order, so the catalog is complete as
soon as this package is imported. The spec grammar and :func:`make_encoding` are in
:mod:`posstats.geometry.encodings.catalog`.
"""

from __future__ import annotations

import importlib
import pkgutil

from posstats.geometry.encodings import families as _families
from posstats.geometry.encodings.catalog import (
    DEFAULT_MAX_ENCODINGS,
    Encoding,
    EncodingSpec,
    check_encoding_count,
    count_encoding_specs,
    encoding_dims,
    encoding_names,
    encoding_sweeps,
    expand_encoding_specs,
    family_of,
    fitted_names,
    make_encoding,
    parse_encoding_spec,
    split_encoding_list,
)

for _module in sorted(m.name for m in pkgutil.iter_modules(_families.__path__)):
    importlib.import_module(f"{_families.__name__}.{_module}")

# the constructors of the built-in families, for direct use (import after registering)
from posstats.geometry.encodings.families.fixed import (  # noqa: E402
    alibi,
    alibi_slopes,
    matrix_power,
    random_encoding,
    sinusoidal,
)
from posstats.geometry.encodings.families.learned import LEARNED_KEYS, learned  # noqa: E402
from posstats.geometry.encodings.families.mds import (  # noqa: E402
    mds_encoding,
    mds_lowrank,
    mds_smacof,
)
from posstats.geometry.encodings.families.rope import (  # noqa: E402
    rope,
    rope_rotation,
    rope_spec_parameters,
    rope_table,
)

__all__ = [
    "DEFAULT_ENCODINGS",
    "DEFAULT_MAX_ENCODINGS",
    "ENCODING_NAMES",
    "FITTED_ENCODINGS",
    "LEARNED_KEYS",
    "Encoding",
    "EncodingSpec",
    "alibi",
    "alibi_slopes",
    "check_encoding_count",
    "count_encoding_specs",
    "encoding_dims",
    "encoding_sweeps",
    "expand_encoding_specs",
    "family_of",
    "learned",
    "make_encoding",
    "matrix_power",
    "mds_encoding",
    "mds_lowrank",
    "mds_smacof",
    "parse_encoding_spec",
    "random_encoding",
    "rope",
    "rope_rotation",
    "rope_spec_parameters",
    "rope_table",
    "sinusoidal",
    "split_encoding_list",
]

# mds-smacof: scored where affordable (AnalysisConfig.smacof_limit geometry rows)
DEFAULT_ENCODINGS = ("mds", "mds-smacof", "sinusoidal", "rope", "alibi", "random", "random:0.02")
ENCODING_NAMES = encoding_names()
# the families fitted to the counts: graded on held-out halves; a fitted "best" says which
# fixed encoding comes closest
FITTED_ENCODINGS = fitted_names()
