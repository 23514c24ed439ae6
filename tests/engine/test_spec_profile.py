"""The start-up step-cost profile's robust estimates (the measurement itself runs in tests/e2e/test_adaptive.py)."""

import pytest

from specdec.engine.spec_profile import median_filter


def test_median_filter_drops_a_lone_outlier():
    # the H100 profile of 2026-11-26 at 4 k: one pair of noisy points made bs 64's slope a tenth of its neighbours'
    slopes = {1: 0.11, 2: 0.10, 4: 0.39, 8: 0.058, 16: 0.041, 32: 0.047, 64: 0.0048}
    smooth = median_filter(slopes)
    assert smooth[4] == pytest.approx(0.10)  # median(0.10, 0.39, 0.058)
    assert smooth[64] == pytest.approx(0.041)  # the last: median of the last three
    assert smooth[1] == pytest.approx(0.11)  # the first: median of the first three
    assert smooth[16] == pytest.approx(0.047)


def test_median_filter_keeps_few_points_and_smooth_runs():
    assert median_filter({1: 0.3, 8: 0.1}) == {1: 0.3, 8: 0.1}
    steady = {1: 0.12, 2: 0.11, 4: 0.09, 8: 0.07}
    assert median_filter(steady) == {1: 0.11, 2: 0.11, 4: 0.09, 8: 0.09}
