"""A progress bar: tqdm when installed, otherwise the plain iterable (long work still logs lines)."""

from __future__ import annotations

import sys
from typing import Iterable, TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], *, desc: str, total: int | None = None, initial: int = 0) -> Iterable[T]:
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    # disable=None: a bar on a terminal, nothing in a log file (the trainer prints log lines too)
    return tqdm(items, desc=desc, total=total, initial=initial, file=sys.stderr, dynamic_ncols=True, disable=None)
