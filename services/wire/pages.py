"""Listing thousands of queries a page at a time: ``?limit=N&after=ID`` on ``GET /queries`` (gateway and registry)
and ``cbgp list --limit N --after ID``, in query-id order, with the cursor of the next page."""

from __future__ import annotations

from bisect import bisect_right
from typing import Mapping

PAGE = 1000  # items per page when the request says nothing
PAGE_MAX = 10_000  # the most a request may ask for


class PageError(ValueError):
    """A bad ``limit`` or ``after`` (its message is the one-line answer)."""


def page_params(params: Mapping[str, str]) -> tuple[str | None, int]:
    """``(after, limit)`` of a request's parameters; :class:`PageError` if ``limit`` is not 1..PAGE_MAX."""
    raw = params.get("limit")
    try:
        limit = PAGE if raw in (None, "") else int(raw)
    except ValueError:
        raise PageError(f"limit must be a whole number from 1 to {PAGE_MAX}, got {raw!r:.40}") from None
    if not 1 <= limit <= PAGE_MAX:
        raise PageError(f"limit must be a whole number from 1 to {PAGE_MAX}, got {limit}")
    return params.get("after") or None, limit


def page(ids: list[str], after: str | None, limit: int) -> tuple[list[str], str | None]:
    """The ``limit`` ids of sorted ``ids`` after ``after`` (None: from the first), and the cursor of the next
    page (None: this is the last)."""
    start = bisect_right(ids, after) if after is not None else 0
    chosen = ids[start:start + limit]
    return chosen, (chosen[-1] if start + limit < len(ids) else None)
