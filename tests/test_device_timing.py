"""The benchmarks' GPU timers (specdec.bench.device_timing): they measure what runs, per call."""

import math

import pytest
import torch

from specdec.bench.device_timing import copy_bandwidth, event_us, graph_us


def test_copy_bandwidth_is_nan_off_cuda():
    assert math.isnan(copy_bandwidth("cpu"))


@pytest.mark.gpu
def test_graph_time_follows_the_kernels_length_and_is_per_call():
    """``torch.cuda._sleep`` spins a fixed number of cycles: twice the cycles take about twice the
    time, and ten calls in one graph take ten times one call's time, reported per call."""
    cycles = 2_000_000
    one = graph_us(lambda: torch.cuda._sleep(cycles), reps=5)
    two = graph_us(lambda: torch.cuda._sleep(2 * cycles), reps=5)
    per_call = graph_us(lambda: torch.cuda._sleep(cycles), reps=5, calls=10)
    assert one > 500  # 2 M cycles at 2 GHz or less: 1 ms or more
    assert two / one == pytest.approx(2.0, rel=0.1)
    assert per_call == pytest.approx(one, rel=0.1)
    assert event_us(lambda: torch.cuda._sleep(cycles), reps=5) == pytest.approx(one, rel=0.1)


@pytest.mark.gpu
def test_copy_bandwidth_is_a_memory_bandwidth():
    bandwidth = copy_bandwidth("cuda", num_bytes=1 << 28)
    assert 1e11 < bandwidth < 2e13  # between 100 GB/s and 20 TB/s
