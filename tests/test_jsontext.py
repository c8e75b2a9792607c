"""posstats.storage.jsontext: every JSON posstats writes is standard JSON (no NaN / Infinity), and a
document says which values were not finite and why they are null."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from posstats.storage import jsontext
from posstats.storage.jsontext import write_json_atomic


def strict_loads(text: str):
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_values_become_null_with_their_paths(tmp_path):
    doc = {"encodings": [{"pearson": float("nan")}, {"pearson": 0.5}], "scale": np.float32("inf"),
           "n": np.int64(3), "ok": np.bool_(True), "m": np.array([1.0, -np.inf])}
    path = write_json_atomic(tmp_path / "report.json", doc)
    back = strict_loads(path.read_text())
    assert back["encodings"][0]["pearson"] is None and back["encodings"][1]["pearson"] == 0.5
    assert back["scale"] is None and back["n"] == 3 and back["ok"] is True and back["m"] == [1.0, None]
    assert back["non_finite"]["paths"] == ["encodings[0].pearson", "scale", "m[1]"]
    assert "written as null" in back["non_finite"]["why"]
    assert "non_finite" not in strict_loads(jsontext.dumps({"a": 1.0}))


def test_arrays_and_numpy_floats_in_lists_keep_their_paths():
    """The fast paths (whole finite arrays, plain and numpy floats inside lists) name the
    same non-finite paths and give the same values as the element-by-element walk."""
    doc = {"a": np.array([1.0, np.nan]), "b": [np.float64(2.0), np.float64("inf"), 3, np.float32(0.5)],
           "c": np.array([1, 2], dtype=np.int32), "d": np.array([0.25, 1.0]), "e": [True, None, "x", -0.0]}
    clean, bad = jsontext.finite(doc)
    assert clean == {"a": [1.0, None], "b": [2.0, None, 3, 0.5], "c": [1, 2], "d": [0.25, 1.0],
                     "e": [True, None, "x", -0.0]}
    assert bad == ["a[1]", "b[1]"]
    assert all(type(x) is float for x in clean["b"] if x is not None and x != 3)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)


@given(json_like)
@settings(max_examples=300, deadline=None)
def test_any_document_is_written_as_standard_json(doc):
    back = strict_loads(jsontext.dumps(doc, note=False))
    clean, bad = jsontext.finite(doc)
    assert back == json.loads(json.dumps(clean))
    assert all(not (isinstance(v, float) and not math.isfinite(v)) for v in _leaves(back))
    assert bool(bad) == (_count_non_finite(doc) > 0)


def _leaves(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


def _count_non_finite(obj) -> int:
    return sum(1 for v in _leaves(obj) if isinstance(v, float) and not math.isfinite(v))
