"""What both throughput benchmarks print and write: the progress bar, the acceptance histogram (text
and PNG) and the commit measured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from specdec.engine import progress


def latency_stats_ms(values: list[float]) -> dict | None:
    """Seconds as milliseconds: mean, median (= p50), p90, p99; None without values."""
    if not values:
        return None
    a = np.asarray(values) * 1e3
    median = float(np.median(a))
    return {"mean": float(a.mean()), "median": median, "p50": median, "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99))}


def progress_bar(total: int, desc: str, *, enabled: bool = True) -> progress.Progress:
    """A context-managed count of finished requests on stderr: a tqdm bar on a terminal, a plain line
    every few seconds in a log (``specdec.engine.progress``), nothing when not ``enabled``."""
    return progress.progress_bar(total, desc, unit="requests", enabled=enabled)


def format_histogram(hist: dict[int, int]) -> list[str]:
    """The text histogram of tokens committed per verify step: one ``length | ### count`` row each."""
    total = sum(hist.values()) or 1
    return [f"  {length:>2} | {'#' * round(40 * count / total):<40} {count}" for length, count in hist.items()]


def plot_histogram(hist: dict[int, int], path: str, *, title: str) -> bool:
    """Write the acceptance histogram as a PNG; False (and a message on stderr) when it cannot."""
    if not hist:
        print(f"--plot: no verify steps (no speculation), so no acceptance histogram for {path}", file=sys.stderr)
        return False
    try:
        from matplotlib.figure import Figure  # the object API: no pyplot, no GUI backend
    except ImportError:
        print(f"--plot: matplotlib is not installed, so {path} was not written (pip install matplotlib)",
              file=sys.stderr)
        return False
    lengths = [int(k) for k in hist]
    total = sum(hist.values())
    mean = sum(int(k) * v for k, v in hist.items()) / total
    fig = Figure(figsize=(6, 3.5), layout="constrained")
    ax = fig.subplots()
    bars = ax.bar(lengths, [v / total for v in hist.values()], color="tab:blue")
    ax.bar_label(bars, labels=[str(v) for v in hist.values()], fontsize=8)
    ax.axvline(mean, color="tab:red", linestyle="--", label=f"mean {mean:.2f}")
    ax.set_xticks(range(1, max(lengths) + 1))
    ax.set_xlabel("tokens committed per verify step (accepted + bonus)")
    ax.set_ylabel(f"share of {total} verify steps")
    ax.set_title(title, fontsize=9)
    ax.margins(y=0.1)
    ax.legend()
    fig.savefig(path, dpi=120)
    print(f"Wrote {path}")
    return True


def git_commit() -> str:
    """The commit measured: $SPECDEC_COMMIT (set where the tree has no .git), else git's HEAD."""
    if os.environ.get("SPECDEC_COMMIT"):
        return os.environ["SPECDEC_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
