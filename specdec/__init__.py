"""specdec: drop-in EAGLE / EAGLE-3 speculative decoding for LLM inference servers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specdec.config import ConfigError, SpecAlgorithm, SpecConfig

if TYPE_CHECKING:
    from specdec.engine.engine import Engine

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The reference host engine is imported lazily: the subsystem never needs it.
    if name == "Engine":
        from specdec.engine.engine import Engine

        return Engine
    raise AttributeError(name)


__all__ = ["ConfigError", "Engine", "SpecAlgorithm", "SpecConfig", "__version__"]
