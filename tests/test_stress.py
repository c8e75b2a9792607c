"""Stress, optimal scale, Pearson and pairwise distances against brute-force oracles, on
every backend (the ``xp`` fixture)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from posstats.errors import InputError
from posstats.geometry.backend import array_namespace, to_numpy
from posstats.geometry.stress import StressResult, pairwise_distances, stress_report


def naive_distances(p):
    p = np.asarray(p, dtype=np.float64)
    return np.sqrt(((p[:, None, :] - p[None, :, :]) ** 2).sum(axis=2))


def naive_report(p, h):
    n = p.shape[0]
    iu = np.triu_indices(n, 1)
    e = naive_distances(p)[iu]
    hv = np.asarray(h, dtype=np.float64)[iu]
    return {
        "stress": ((e - hv) ** 2).sum() / (hv**2).sum(),
        "scaled_stress": 1 - (e @ hv) ** 2 / ((e @ e) * (hv @ hv)),
        "scale": (e @ hv) / (e @ e),
        "pearson": np.corrcoef(e, hv)[0, 1],
        "pairs": n * (n - 1) // 2,
        "e": e,
        "h": hv,
    }


def random_case(seed, n=23, d=5, k=7):
    rng = np.random.default_rng(seed)
    p = rng.standard_normal((n, d))
    # h from another configuration, so that the fit is imperfect but correlated.
    q = np.hstack([p, 0.5 * rng.standard_normal((n, k))])
    return p, naive_distances(q)


@pytest.mark.parametrize("block", [1, 3, 7, 2048])
def test_matches_naive_for_any_block(xp, block):
    p, h = random_case(0)
    want = naive_report(p, h)
    got = stress_report(xp.asarray(p), xp.asarray(h), block=block)
    for name in ("stress", "scaled_stress", "scale", "pearson"):
        np.testing.assert_allclose(getattr(got, name), want[name], rtol=1e-10, err_msg=name)
    assert got.pairs == want["pairs"]


# Coordinates are either 0 or at least 1e-100 in magnitude: squared distances of
# denormal-scale rows underflow to 0 in any float64 implementation.
finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False).filter(lambda x: x == 0 or abs(x) > 1e-100)


@settings(max_examples=60, deadline=None)
@given(
    p=hnp.arrays(np.float64, st.tuples(st.integers(2, 12), st.integers(1, 4)), elements=finite),
    seed=st.integers(0, 2**16),
    block=st.integers(1, 5),
)
def test_property_blocked_equals_naive(xp, p, seed, block):
    n = p.shape[0]
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.01, 2.0, (n, n))
    h = np.triu(a, 1) + np.triu(a, 1).T
    got = stress_report(xp.asarray(p), xp.asarray(h), block=block)
    if not np.any(np.ptp(p, axis=0)):
        # Every row equal: all e = 0, the documented degenerate result.
        assert (got.scale, got.scaled_stress, got.stress) == (0.0, 1.0, 1.0)
        return
    want = naive_report(p, h)
    # Gram-form distances: absolute error ~ sqrt(eps) * |p| at worst on near-equal rows.
    np.testing.assert_allclose(got.stress, want["stress"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got.scaled_stress, want["scaled_stress"], rtol=1e-6, atol=1e-6)
    if np.ptp(want["e"]) > 1e-3:
        np.testing.assert_allclose(got.pearson, want["pearson"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got.scale, want["scale"], rtol=1e-6, atol=1e-9)


def test_pearson_matches_corrcoef_over_pairs(xp):
    p, h = random_case(3, n=40)
    want = naive_report(p, h)
    np.testing.assert_allclose(stress_report(xp.asarray(p), xp.asarray(h), block=6).pearson, np.corrcoef(want["e"], want["h"])[0, 1], rtol=1e-12)


def test_exact_embedding_of_h_has_zero_stress(xp):
    rng = np.random.default_rng(5)
    q = rng.standard_normal((30, 4))
    h = naive_distances(q)
    rot, _ = np.linalg.qr(rng.standard_normal((6, 6)))
    # Same distances: rotated, translated and zero-padded to a wider model.
    p = np.hstack([q, np.zeros((30, 2))]) @ rot + 100.0
    got = stress_report(xp.asarray(p), xp.asarray(h), block=4)
    np.testing.assert_allclose(got.stress, 0.0, atol=1e-10)
    np.testing.assert_allclose(got.scaled_stress, 0.0, atol=1e-10)
    np.testing.assert_allclose(got.scale, 1.0, rtol=1e-8)
    np.testing.assert_allclose(got.pearson, 1.0, rtol=1e-10)


@pytest.mark.parametrize("factor", [1e-3, 0.5, 7.0, 1e4])
def test_scaled_stress_is_scale_invariant(xp, factor):
    p, h = (xp.asarray(a) for a in random_case(7))
    base = stress_report(p, h)
    scaled = stress_report(factor * p, h)
    np.testing.assert_allclose(scaled.scaled_stress, base.scaled_stress, rtol=1e-9)
    np.testing.assert_allclose(scaled.scale, base.scale / factor, rtol=1e-9)
    np.testing.assert_allclose(scaled.pearson, base.pearson, rtol=1e-9)


def test_raw_stress_is_minimised_at_optimal_scale(xp):
    p, h = (xp.asarray(a) for a in random_case(11))
    got = stress_report(p, h)
    at_opt = stress_report(got.scale * p, h).stress
    np.testing.assert_allclose(at_opt, got.scaled_stress, rtol=1e-9)
    for a in got.scale * np.array([0.5, 0.9, 0.99, 1.01, 1.1, 2.0]):
        assert stress_report(a * p, h).stress > at_opt
    # Raw stress is dominated by scale: a sinusoid-sized encoding is far above 1.
    assert stress_report(50.0 * p, h).stress > 1.0


def test_only_upper_triangle_of_distances_is_read(xp):
    p, h = random_case(2, n=12)
    g = h.copy()
    g[np.tril_indices(12, -1)] = np.nan
    p, h, g = xp.asarray(p), xp.asarray(h), xp.asarray(g)
    a, b = stress_report(p, h), stress_report(p, g)
    np.testing.assert_allclose(
        [b.stress, b.scaled_stress, b.scale, b.pearson], [a.stress, a.scaled_stress, a.scale, a.pearson], rtol=1e-12
    )


def test_all_zero_encoding_is_degenerate_not_an_error(xp):
    _, h = random_case(1)
    got = stress_report(xp.ones((h.shape[0], 3)), xp.asarray(h))
    assert got.scale == 0.0
    assert got.scaled_stress == 1.0
    assert got.stress == 1.0
    assert math.isnan(got.pearson)


def test_all_zero_distances_raise(xp):
    with pytest.raises(InputError, match="all 10 corpus distances are 0"):
        stress_report(xp.eye(5), xp.zeros((5, 5)))
    with pytest.raises(ValueError):
        stress_report(xp.eye(5), xp.zeros((5, 5)))


@pytest.mark.parametrize(
    ("p", "h", "match"),
    [
        (np.zeros((4, 2)), np.ones((4, 3)), "must be"),
        (np.zeros(4), np.ones((4, 4)), "2-D"),
        (np.zeros((1, 2)), np.ones((1, 1)), "at least 2"),
    ],
)
def test_bad_shapes_raise(xp, p, h, match):
    with pytest.raises(ValueError, match=match):
        stress_report(xp.asarray(p), xp.asarray(h))


def test_to_dict_is_json_ready(xp):
    p, h = random_case(4, n=6)
    got = stress_report(xp.asarray(p), xp.asarray(h))
    d = got.to_dict()
    assert set(d) == {"stress", "scaled_stress", "scale", "pearson", "pairs"}
    assert json.loads(json.dumps(d)) == d
    assert isinstance(got, StressResult)


@pytest.mark.parametrize("block", [1, 4, 2048])
def test_pairwise_distances_matches_naive(xp, block):
    rng = np.random.default_rng(9)
    p = rng.standard_normal((17, 6)) * 3
    out = pairwise_distances(xp.asarray(p), block=block)
    assert array_namespace(out) is xp  # the output stays on the input's device
    d = to_numpy(out)
    np.testing.assert_allclose(d, naive_distances(p), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(d, d.T)
    np.testing.assert_array_equal(np.diag(d), np.zeros(17))
    assert d.dtype == np.float64


def test_pairwise_distances_near_identical_rows_stay_nonnegative(xp):
    rng = np.random.default_rng(0)
    base = rng.standard_normal(8) * 1e3
    p = base + 1e-9 * rng.standard_normal((10, 8))
    d = to_numpy(pairwise_distances(xp.asarray(p)))
    assert np.all(d >= 0)
    np.testing.assert_array_equal(np.diag(d), np.zeros(10))
    # Centring removes the common offset, so even these distances are accurate.
    np.testing.assert_allclose(d, naive_distances(p - base), rtol=1e-5, atol=1e-12)
