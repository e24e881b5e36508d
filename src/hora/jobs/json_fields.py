"""Reading JSON records that hora's own processes wrote (the job's plan, the attempts' records), field by field:
a missing field or one of the wrong type is a ValueError that names it, never a KeyError or a TypeError later."""

from __future__ import annotations

from typing import Any

__all__ = ["Fields"]


class Fields:
    """Typed access to the fields of one JSON object, part of ``what`` (``the plan``) at ``prefix``
    (``parameter_server.``); every problem is a ValueError naming the field (``parameter_server.servers``)."""

    def __init__(self, data: Any, what: str, prefix: str = "") -> None:
        if not isinstance(data, dict):
            where = f"field {prefix.rstrip('.')!r}" if prefix else what
            raise ValueError(f"{where} is {type(data).__name__}, not a JSON object")
        self.data, self.prefix = data, prefix

    def has(self, name: str) -> bool:
        return name in self.data

    def _get(self, name: str) -> Any:
        if name not in self.data:
            raise ValueError(f"no field {self.prefix + name!r}")
        return self.data[name]

    def _wrong(self, name: str, value: Any, wanted: str) -> ValueError:
        return ValueError(f"field {self.prefix + name!r} is {value!r}, not {wanted}")

    def string(self, name: str) -> str:
        value = self._get(name)
        if not isinstance(value, str):
            raise self._wrong(name, value, "a string")
        return value

    def choice(self, name: str, allowed: tuple[str, ...]) -> str:
        value = self._get(name)
        if value not in allowed:
            raise self._wrong(name, value, "one of " + ", ".join(repr(a) for a in allowed))
        return str(value)

    def number(self, name: str) -> float:
        value = self._get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._wrong(name, value, "a number")
        return float(value)

    def integer(self, name: str) -> int:
        value = self._get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._wrong(name, value, "a whole number")
        return value

    def boolean(self, name: str) -> bool:
        value = self._get(name)
        if not isinstance(value, bool):
            raise self._wrong(name, value, "true or false")
        return value

    def items(self, name: str) -> list[Any]:
        value = self._get(name)
        if not isinstance(value, list):
            raise self._wrong(name, value, "a list")
        return value

    def strings(self, name: str) -> tuple[str, ...]:
        value = self._get(name)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._wrong(name, value, "a list of strings")
        return tuple(value)

    def mapping(self, name: str) -> dict[str, Any]:
        value = self._get(name)
        if not isinstance(value, dict):
            raise self._wrong(name, value, "a JSON object")
        return value

    def string_map(self, name: str) -> dict[str, str]:
        value = self.mapping(name)
        if not all(isinstance(v, str) for v in value.values()):
            raise self._wrong(name, value, "an object of strings")
        return value

    def optional_integer(self, name: str) -> int | None:
        return None if self._get(name) is None else self.integer(name)

    def optional_string(self, name: str) -> str | None:
        return None if self.data.get(name) is None else self.string(name)

    def codes(self, name: str) -> tuple[int | None, ...]:
        """A list of exit codes, None for a process that has not ended."""
        value = self._get(name)
        if not isinstance(value, list) or not all(
            v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in value
        ):
            raise self._wrong(name, value, "a list of exit codes (whole numbers or null)")
        return tuple(value)
