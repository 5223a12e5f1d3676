"""One structured log line: ``key=value`` pairs, every service's log format (no imports: the settings readers and
the codecs both use it)."""

from __future__ import annotations

from typing import Any

__all__ = ["kv"]


def kv(**fields: Any) -> str:
    """``key=value`` pairs for one structured log line; a value that is empty or holds a space, a line break or
    another unprintable character is quoted (``repr``), so a value from outside never splits or forges a line."""
    parts = []
    for key, value in fields.items():
        text = str(value)
        plain = text and text.isprintable() and " " not in text
        parts.append(f"{key}={text}" if plain else f"{key}={text!r}")
    return " ".join(parts)
