"""Checking a spec: problems are collected, not raised one at a time, so the user sees all of them at once."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["Checker", "type_name", "unknown_field"]


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def unknown_field(key: str, known: tuple[str, ...], where: str) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known fields: {', '.join(known)}"
    return f"unknown field {key!r}{where}{hint}"


class Checker:
    """Collects problems instead of raising at the first, so the user sees all of them."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def int_(self, data: Mapping[str, Any], key: str, default: int, minimum: int, where: str = "") -> int:
        value = data.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(f"{key}{where} must be a whole number >= {minimum}, got {value!r} ({type_name(value)})")
            return default
        if value < minimum:
            self.add(f"{key}{where} must be >= {minimum}, got {value}")
            return default
        return value

    def number(self, data: Mapping[str, Any], key: str, default: float) -> float:
        value = data.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            self.add(f"{key} must be a number of seconds > 0, got {value!r} ({type_name(value)})")
            return default
        if value <= 0:
            self.add(f"{key} must be > 0 seconds, got {value}")
            return default
        return float(value)

    def str_(self, data: Mapping[str, Any], key: str, where: str = "") -> str | None:
        value = data.get(key)
        if value is None:
            return None
        if not isinstance(value, (str, os.PathLike)):
            self.add(f"{key}{where} must be a string, got {value!r} ({type_name(value)})")
            return None
        return os.fspath(value)
