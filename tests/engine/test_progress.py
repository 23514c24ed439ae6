"""Progress output: plain, rate-limited lines in a log (no carriage returns, no ANSI codes, a last
line at completion), a tqdm bar that redraws at most twice a second on a terminal, nothing when
disabled; the benchmarks' request counter and the trainer's iterable go through it."""

import io

import pytest
from tqdm import tqdm

from specdec.bench import report
from specdec.engine.progress import LineProgress, SilentProgress, progress, progress_bar


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def _lines(stream: io.StringIO) -> list[str]:
    text = stream.getvalue()
    assert "\r" not in text and "\x1b" not in text  # no redraws, no ANSI codes
    assert text.endswith("\n") or not text
    return text.splitlines()


def test_log_lines_are_rate_limited_and_the_last_one_is_printed():
    stream, clock = io.StringIO(), FakeClock()
    bar = LineProgress(240, "baseline", unit="requests", stream=stream, interval_s=15.0, clock=clock)
    with bar:
        for _ in range(240):  # one request a quarter second: 60 s of work
            clock.now += 0.25
            bar.update(1)
    lines = _lines(stream)
    # one line each 15 s of the run, the last at completion (60 s, not repeated at close)
    assert lines == [f"baseline: {n}/240 requests, {n / 4:.1f} s" for n in (60, 120, 180, 240)]


def test_log_lines_without_a_total_and_no_repeat_at_close():
    stream, clock = io.StringIO(), FakeClock()
    with LineProgress(None, "train", unit="steps", stream=stream, clock=clock) as bar:
        clock.now += 20
        bar.update(3)  # past the interval: printed
        clock.now += 20
        bar.update(0)  # nothing new: not printed again
    assert _lines(stream) == ["train: 3 steps, 20.0 s"]  # close adds no copy of the same count


def test_a_fast_run_prints_one_line_at_completion():
    stream = io.StringIO()
    with progress_bar(8, "speculative", unit="requests", stream=stream) as bar:
        for _ in range(8):
            bar.update(1)
    lines = _lines(stream)
    assert len(lines) == 1 and lines[0].startswith("speculative: 8/8 requests, 0.")


def test_a_failed_run_still_reports_how_far_it_got():
    stream = io.StringIO()
    with pytest.raises(RuntimeError):
        with progress_bar(8, "baseline", unit="requests", stream=stream) as bar:
            bar.update(3)
            raise RuntimeError("server gone")
    assert [line.split(",")[0] for line in _lines(stream)] == ["baseline: 3/8 requests"]


def test_iterable_counts_each_item_after_its_work_and_ends_with_a_line():
    stream = io.StringIO()
    assert list(progress(["a", "b", "c"], desc="regenerate", unit="chunks", stream=stream)) == ["a", "b", "c"]
    assert [line.split(",")[0] for line in _lines(stream)] == ["regenerate: 3/3 chunks"]


def test_iterable_resumed_and_stopped_early_reports_where_it_stopped():
    """The trainer resumes at ``initial`` and may stop before ``total`` (its time budget)."""
    stream = io.StringIO()
    steps = progress(range(4, 10), desc="train eagle3", total=10, initial=4, unit="steps", stream=stream)
    for step in steps:
        if step == 7:
            break
    steps.close()  # what dropping the last reference does
    assert [line.split(",")[0] for line in _lines(stream)] == ["train eagle3: 7/10 steps"]


def test_disabled_prints_nothing():
    stream = io.StringIO()
    bar = progress_bar(8, "baseline", stream=stream, enabled=False)
    assert isinstance(bar, SilentProgress)
    with bar:
        bar.update(8)
    assert list(progress(range(3), desc="x", stream=stream, enabled=False)) == [0, 1, 2]
    assert stream.getvalue() == ""


def test_terminal_gets_a_tqdm_bar_that_redraws_at_most_twice_a_second():
    stream = FakeTTY()
    with progress_bar(10_000, "baseline", unit="requests", stream=stream) as bar:
        assert isinstance(bar, tqdm)
        assert bar.mininterval == 0.5
        for _ in range(10_000):
            bar.update(1)
    text = stream.getvalue()
    assert "10000/10000" in text
    # the first draw, at most a few timed redraws over a run this short, and the final one
    assert text.count("\r") <= 6


def test_bench_request_counter_writes_plain_lines_to_a_logged_stderr(capsys):
    with report.progress_bar(3, "baseline") as bar:
        bar.update(2)
        bar.update(1)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.startswith("baseline: 3/3 requests, ") and err.count("\n") == 1
    with report.progress_bar(3, "baseline", enabled=False) as bar:
        bar.update(3)
    assert capsys.readouterr().err == ""
