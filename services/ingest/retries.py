"""Raw records sent twice by a producer's retry: ``cbgp publish`` numbers its records, and ingest takes each once.

``cbgp publish``'s producer is not idempotent (librdkafka's idempotent producer sends nothing for its first half
second: docs/benchmarks.md) but keeps one request in flight, so a retry repeats its batch before anything later:
never a reordering, at worst a batch twice in a row.  Each record carries its publish's id (``cbgp-publish``) and
number (``cbgp-record``, from 1); a record whose number is at or below the highest taken for that id on its raw
partition is such a copy and is dropped.  The highest numbers of the most recent ids ride in the commit metadata
of the raw offsets (:meth:`Retries.metadata`), so a restore, or the replica that takes over, knows them.  Records
without both headers (a producer of the user's own, idempotent or not) are always taken.
"""

from __future__ import annotations

import json
import logging
from typing import Mapping

from prometheus_client import Counter

from services.wire.loglines import kv
from services.wire.records import NUMBER_HEADER, PUBLISH_HEADER

log = logging.getLogger("cbgp.ingest")

KEPT_IDS = 32  # publishes remembered per raw partition, the most recent: several may write at once
MAX_ID_CHARS = 64  # a longer id is no publish's (cbgp publish sends 32 hex digits): taken, not remembered
MAX_NUMBER_DIGITS = 19  # a record number fits a signed 64-bit integer: a longer one is no publish's either
REPEATED = Counter("cbgp_ingest_repeated_records", "Raw records dropped as a producer retry's copy of one taken.")


class Retries:
    """Per raw partition, the highest record number taken of each recent publish id."""

    def __init__(self) -> None:
        self.taken: dict[int, dict[str, int]] = {}  # raw partition -> publish id -> highest number (oldest id first)

    def is_copy(self, partition: int, offset: int, headers: Mapping[str, bytes]) -> bool:
        """Whether the record at ``offset`` of ``partition``, with these headers, repeats one already taken
        (counted and logged); if not, it is noted as taken (the caller takes it)."""
        ident, number = headers.get(PUBLISH_HEADER), headers.get(NUMBER_HEADER)
        if ident is None or number is None or len(ident) > MAX_ID_CHARS or len(number) > MAX_NUMBER_DIGITS:
            return False
        try:
            key, n = ident.decode("ascii"), int(number)
        except (UnicodeDecodeError, ValueError):
            return False  # (not cbgp publish's: taken as any other record)
        seen = self.taken.setdefault(partition, {})
        last = seen.pop(key, None)
        if last is not None and n <= last:
            seen[key] = last
            REPEATED.inc()
            log.info(kv(event="repeated-record", partition=partition, offset=offset, publish=key, record=n))
            return True
        seen[key] = n  # (above the last taken, or the id's first)
        while len(seen) > KEPT_IDS:
            del seen[next(iter(seen))]
        return False

    def metadata(self, partition: int) -> str:
        """What is taken of ``partition``, for the commit metadata of its offset (under 3 KB: a broker keeps 4)."""
        return json.dumps({"publish": [[key, n] for key, n in self.taken.get(partition, {}).items()]},
                          separators=(",", ":"))

    def restore(self, partition: int, metadata: str | None) -> None:
        """Take ``partition``'s state from the metadata committed with its offset (none, or not ours: nothing
        taken, with one log line when it cannot be read)."""
        seen: dict[str, int] = {}
        if metadata:
            try:
                entries = json.loads(metadata).get("publish", [])
                for key, n in entries[-KEPT_IDS:]:
                    if isinstance(key, str) and len(key) <= MAX_ID_CHARS and type(n) is int:
                        seen[key] = n
            except (ValueError, AttributeError, TypeError):
                log.warning(kv(event="commit-metadata-ignored", partition=partition, reason="not readable",
                               excerpt=metadata[:80]))
                seen = {}
        self.taken[partition] = seen
