"""The entry point of the hora.jax test ranks: imports JAX (and turns on 64-bit types) only in the ranks, never in
the pytest process."""

from __future__ import annotations

from typing import Any


def suite_worker(parts: list[str], examples: str) -> dict[str, Any]:
    from workers.jax_ops import suite_worker as run

    return run(parts, examples)
