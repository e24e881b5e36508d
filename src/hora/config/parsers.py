"""How a setting's text (an environment variable, a flag, an argument) becomes its value. Each parser raises
``ValueError`` with what it expected; the caller names the variable or flag."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

__all__ = [
    "choice",
    "consistency",
    "log_level",
    "megabytes",
    "non_negative_float",
    "non_negative_int",
    "parse_bool",
    "port_range",
    "positive_float",
    "positive_int",
]

_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f", ""}


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE - {''})}")


def positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):  # also refuses nan and inf: every wait needs a real limit
        raise ValueError("expected a finite number > 0")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):  # nan fails the comparison
        raise ValueError("expected a finite number >= 0")
    return value + 0.0  # -0.0 becomes 0.0


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("expected a whole number >= 0")
    return value


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("expected a whole number > 0")
    return value


def choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


def consistency(text: str) -> str:
    """A parameter-server consistency: ``async``, ``sync`` or ``bounded(k)`` (normalised to that spelling)."""
    value = text.strip().lower().replace(" ", "")
    m = re.fullmatch(r"bounded(?:\((\d+)\)|:(\d+))", value)
    if m:
        return f"bounded({int(m.group(1) or m.group(2))})"
    if value in ("async", "sync"):
        return value
    raise ValueError("expected async, sync or bounded(k) with a whole k >= 0")


LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")


def log_level(text: str) -> str:
    value = text.strip().upper()
    aliases = {"TRACE": "DEBUG", "WARN": "WARNING", "FATAL": "CRITICAL"}
    value = aliases.get(value, value)
    if value not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
        raise ValueError("expected one of trace, debug, info, warning, error, fatal")
    return value


def port_range(text: str) -> str:
    """``LOW-HIGH`` (inclusive, 1..65535) or empty for any free port."""
    value = text.strip()
    if not value:
        return ""
    low, sep, high = value.partition("-")
    try:
        lo, hi = int(low), int(high if sep else low)
    except ValueError:
        raise ValueError("expected LOW-HIGH, e.g. 29500-29600") from None
    if not 1 <= lo <= hi <= 65535:
        raise ValueError("expected LOW-HIGH with 1 <= LOW <= HIGH <= 65535")
    return f"{lo}-{hi}"


def megabytes(text: str) -> int:
    """A number of MiB (whole or not) as bytes: ``--fusion-threshold-mb``."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError("expected a finite number of MB >= 0")
    return int(value * 1024 * 1024)
