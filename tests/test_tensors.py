"""posstats.storage.tensors: the one safetensors reader of model tensors (learned: encodings, audit)
opens a well-formed file and refuses every malformed header with an InputError naming the
file: never a traceback, never a read past the file."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file

from posstats.errors import InputError
from posstats.storage.tensors import SafetensorsFile


def raw_file(path: Path, header: object, data: bytes) -> Path:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def good_header() -> tuple[dict, bytes]:
    data = np.arange(12, dtype="<f4").tobytes()
    return {"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]}}, data


def test_a_valid_file_reads_back(tmp_path):
    save_file({"pos": np.arange(6, dtype=np.float32).reshape(3, 2)}, str(tmp_path / "a.safetensors"), {"k": "v"})
    f = SafetensorsFile(tmp_path / "a.safetensors")
    np.testing.assert_array_equal(f.get("pos"), np.arange(6, dtype=np.float32).reshape(3, 2))
    assert f.metadata == {"k": "v"} and f.shape("pos") == (3, 2)


MALFORMED = [
    ({"w": {"dtype": "F32", "data_offsets": [0, 48]}}, "shape"),                      # no shape
    ({"__metadata__": [1, 2], "w": good_header()[0]["w"]}, "__metadata__"),           # non-dict metadata
    ({"__metadata__": {"a": 1}, "w": good_header()[0]["w"]}, "__metadata__"),         # non-string value
    ({"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [-8, 40]}}, "outside"),  # negative offset
    ({"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [48, 0]}}, "outside"),   # reversed
    ({"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 4800]}}, "outside"), # past the end
    ({"w": {"dtype": "F32", "shape": [3, 5], "data_offsets": [0, 48]}}, "needs 60 bytes"),
    ({"w": {"dtype": "F32", "shape": [-3, -4], "data_offsets": [0, 48]}}, "shape"),
    ({"w": {"dtype": "F32", "shape": "3x4", "data_offsets": [0, 48]}}, "shape"),
    ({"w": {"dtype": "Q4", "shape": [3, 4], "data_offsets": [0, 48]}}, "dtype"),
    ({"w": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48.0]}}, "data_offsets"),
    ({"w": [1, 2, 3]}, "not an object"),
    ([1, 2], "not a JSON object"),
]


@pytest.mark.parametrize(("header", "why"), MALFORMED)
def test_malformed_headers_are_refused_in_one_line(tmp_path, header, why):
    path = raw_file(tmp_path / "bad.safetensors", header, good_header()[1])
    with pytest.raises(InputError, match=f"bad.safetensors: not a readable safetensors file .*{why}") as info:
        SafetensorsFile(path)
    assert "\n" not in str(info.value)


def test_truncated_deeply_nested_and_non_regular_files(tmp_path):
    (tmp_path / "short").write_bytes(b"\x05\x00")
    (tmp_path / "long").write_bytes(struct.pack("<Q", 2**40) + b"{}")
    deep = b"[" * 100_000 + b"]" * 100_000
    (tmp_path / "deep").write_bytes(struct.pack("<Q", len(deep)) + deep)
    for name in ("short", "long", "deep"):
        with pytest.raises(InputError, match="not a readable safetensors file"):
            SafetensorsFile(tmp_path / name)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(InputError, match="not a regular file"):
        SafetensorsFile(tmp_path / "fifo")  # never opened: a FIFO would block forever


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@given(field=st.sampled_from(["dtype", "shape", "data_offsets", "__metadata__", "entry"]), value=json_values)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzzed_headers_open_and_read_or_are_refused(tmp_path, field, value):
    """Any value in any field: either every tensor reads back with its declared shape, or
    the file is refused with an InputError; nothing else escapes."""
    header, data = good_header()
    if field == "__metadata__":
        header["__metadata__"] = value
    elif field == "entry":
        header["w"] = value
    else:
        header["w"][field] = value
    path = raw_file(tmp_path / "fuzz.safetensors", header, data)
    try:
        f = SafetensorsFile(path)
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    for name in f.keys():
        try:
            assert f.get(name).shape == f.shape(name)
        except InputError:
            pass
