"""The consistency setting's spellings: ``async``, ``sync``, ``bounded(k)``."""

from __future__ import annotations

import re

from hora.errors import ConfigError

__all__ = ["parse_consistency"]


def parse_consistency(text: str, staleness: int | None = None) -> tuple[str, int]:
    """``"async"``, ``"sync"`` or ``"bounded(k)"`` (also ``"bounded:k"``, or ``"bounded"`` with ``staleness``)
    -> (mode, k)."""
    value = text.strip().lower()
    m = re.fullmatch(r"bounded(?:\((\d+)\)|:(\d+))?", value)
    if m:
        k = m.group(1) or m.group(2)
        if k is None and staleness is None:
            raise ConfigError("consistency 'bounded' needs a staleness: write bounded(k) or pass staleness=k")
        return "bounded", int(k) if k is not None else int(staleness or 0)
    if value in ("async", "sync"):
        if staleness is not None and value == "sync" and staleness:
            raise ConfigError(
                f"consistency 'sync' has no staleness (got staleness={staleness}); use bounded({staleness})"
            )
        return value, 0
    raise ConfigError(f"consistency {text!r} is not one of async, sync, bounded(k)")
