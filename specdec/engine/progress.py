"""Progress of long work on stderr, fit for a terminal and for a log file alike.

On a terminal: a tqdm bar that redraws at most twice a second. Anywhere else (stderr redirected to a
file, a pipe, CI): plain lines such as ``baseline: 3/8 requests, 12.3 s``, one every ``interval_s``
seconds at most and one at completion, with no carriage returns and no ANSI codes. ``enabled=False``
prints nothing. The benchmarks and the trainer both count their work through here.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Iterable, Iterator, Protocol, TextIO, TypeVar

T = TypeVar("T")

TTY_MININTERVAL_S = 0.5  # a bar's fastest redraw on a terminal
LOG_INTERVAL_S = 15.0  # a plain line's fastest repeat in a log


class Progress(Protocol):
    """What a counter offers: ``update`` per unit of work finished, closed by its ``with`` block."""

    def update(self, n: int = 1) -> object: ...

    def close(self) -> None: ...

    def __enter__(self) -> "Progress": ...

    def __exit__(self, *exc) -> None: ...


class SilentProgress:
    """Counts nothing and prints nothing (``enabled=False``)."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "SilentProgress":
        return self

    def __exit__(self, *exc) -> None:
        pass


class LineProgress:
    """Plain progress lines for a log: at most one per ``interval_s``, and a last one at completion
    (when the count reaches ``total``, or at ``close``) unless that count was already printed."""

    def __init__(self, total: int | None, desc: str, *, unit: str, stream: TextIO, initial: int = 0,
                 interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        self.total, self.desc, self.unit, self.stream = total, desc, unit, stream
        self.n, self.interval_s, self.clock = initial, interval_s, clock
        self.start = self.last_print = clock()
        self.printed_n: int | None = None
        self.closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.total is not None and self.n >= self.total:
            self._print()
        elif self.clock() - self.last_print >= self.interval_s:
            self._print()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._print()

    def line(self) -> str:
        """``desc: n/total unit, seconds s`` (``desc: n unit, ...`` without a total)."""
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        return f"{self.desc}: {count} {self.unit}, {self.clock() - self.start:.1f} s"

    def _print(self) -> None:
        if self.printed_n == self.n:
            return
        print(self.line(), file=self.stream, flush=True)
        self.printed_n, self.last_print = self.n, self.clock()

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def _tqdm():
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm


def progress_bar(total: int | None, desc: str, *, unit: str = "it", initial: int = 0, enabled: bool = True,
                 stream: TextIO | None = None, interval_s: float = LOG_INTERVAL_S) -> Progress:
    """A context-managed counter of ``total`` units of work on ``stream`` (stderr): a tqdm bar on a
    terminal, plain lines elsewhere (or without tqdm), nothing when not ``enabled``."""
    if not enabled:
        return SilentProgress()
    stream = sys.stderr if stream is None else stream
    tqdm = _tqdm() if _is_terminal(stream) else None
    if tqdm is not None:
        return tqdm(total=total, desc=desc, unit=unit, initial=initial, file=stream, dynamic_ncols=True,
                    mininterval=TTY_MININTERVAL_S)
    return LineProgress(total, desc, unit=unit, stream=stream, initial=initial, interval_s=interval_s)


def progress(items: Iterable[T], *, desc: str, total: int | None = None, initial: int = 0, unit: str = "it",
             enabled: bool = True, stream: TextIO | None = None, interval_s: float = LOG_INTERVAL_S) -> Iterator[T]:
    """``items``, counted by ``progress_bar`` as each one's work finishes (when the next is asked for).

    ``total`` defaults to ``initial + len(items)`` where ``items`` has a length."""
    if total is None and hasattr(items, "__len__"):
        total = initial + len(items)  # type: ignore[arg-type]
    bar = progress_bar(total, desc, unit=unit, initial=initial, enabled=enabled, stream=stream, interval_s=interval_s)
    with bar:
        for item in items:
            yield item
            bar.update(1)
