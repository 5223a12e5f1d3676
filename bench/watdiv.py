"""The Stream-WatDiv stream (`../shared/data/stream-watdiv/stream.txt.gz`) as updates with deletions.

Its lines are `subject<TAB>predicate<TAB>object<TAB>timestamp`, IRIs bare and literals quoted; the triples are
taken in timestamp order (ties in file order), duplicates dropped, and a fifth of them deleted within a fifth of
the stream after their insert, as a sliding window's expiry (`lsbench.with_deletes`).
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from lsbench import Triple, UpdateRow, with_deletes

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "stream-watdiv" / "stream.txt.gz"
WSDBM = "http://db.uwaterloo.ca/~galuc/wsdbm/"


def _term(text: str) -> str:
    return text if text.startswith('"') else f"<{text}>"


def load(path: Path = DEFAULT_DATA, limit: int | None = None) -> list[Triple]:
    """The stream's distinct triples in timestamp order (canonical N-Triples terms); the first ``limit``."""
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            s, p, o, stamp = line.rstrip("\n").split("\t")
            rows.append((int(stamp), number, (_term(s), _term(p), _term(o))))
    rows.sort()
    seen: set[Triple] = set()
    out: list[Triple] = []
    for _stamp, _number, triple in rows:
        if triple not in seen:
            seen.add(triple)
            out.append(triple)
            if limit is not None and len(out) == limit:
                break
    return out


def updates(triples: list[Triple], delete_fraction: float = 0.2, window_fraction: float = 0.2,
            seed: int = 7) -> list[UpdateRow]:
    """``triples`` inserted in order, ``delete_fraction`` of them deleted later."""
    return with_deletes(triples, 0, delete_fraction, window_fraction, random.Random(seed))[0]
