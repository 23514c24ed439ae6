"""The start-up step-cost profile's robust estimates (the measurement itself runs in tests/e2e/test_adaptive.py)."""

import pytest

from specdec.engine.spec_profile import STEPS_PER_BLOCK, median_filter, timed_steps_that_fit


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


@pytest.mark.parametrize("context_length, expected", [
    (8192, STEPS_PER_BLOCK),  # a server: the full blocks
    (112, 2),  # the tiny sweep's engine: (112 - 64) // 4 = 12 steps of room, 2 warm-up, 2 more, 3 blocks of 2
    (80, 4),  # no room beside a 64-token prompt; after 8 tokens: (80 - 8) // 4 = 18 steps, 3 blocks of 4
    (30, 0),  # not one step fits
])
def test_timed_steps_shrink_to_the_context_length(context_length, expected):
    steps = timed_steps_that_fit(context_length, 4, steps=STEPS_PER_BLOCK, warmup=2, prompt=64)
    assert steps == expected
    if steps:
        assert context_length - (2 + 3 * steps + 2) * 4 >= 8


def test_profiled_batch_sizes_thin_out_past_64_but_keep_each_shapes_last_size():
    from specdec.cuda_graph import default_batch_sizes
    from specdec.engine.spec_profile import profiled_batch_sizes

    sizes = default_batch_sizes(256)  # 1..8, 16..64 by 8, 96..256 by 32
    assert profiled_batch_sizes(sizes, {}) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24, 32, 40, 48, 56, 64, 128, 256]
    # a shape whose graphs end at 160 is measured there, not extrapolated from 128
    assert 160 in profiled_batch_sizes(sizes, {"3x1x4": 160, "6x8x32": 16})
    assert profiled_batch_sizes([1, 2, 96], {}) == [1, 2, 96]  # the largest always
