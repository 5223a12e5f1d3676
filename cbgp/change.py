"""One change to the graph, the one representation from ingest to the workers.

In the spirit of differential dataflow's ``(data, time, diff)``: the quad's term ids are the data, its
``seq`` in the total order (updates.encoded) is the time and ``diff`` is +1 (insert) or -1 (delete).  Two
fields say how it travels: the ``role`` of the partition that receives it (a change goes to its subject's
partition and to its object's) and whether it is a ``refresh``.  Avro's ``ADD``/``DEL`` and
``SUBJECT``/``OBJECT``/``BOTH`` exist only at the wire boundary (``services.codec``).

A :class:`Change` is a named tuple: built and unpacked at tuple speed on the data path, read by name elsewhere.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

__all__ = ["Change", "change_of", "INSERT", "DELETE", "ROLE_SUBJECT", "ROLE_OBJECT", "ROLE_BOTH", "ROLE_NAMES",
           "partition_of", "routes"]

INSERT, DELETE = 1, -1

# Which end of its triple a partition keys a change by: stars and single-centre components centred on a
# subject see it with ROLE_SUBJECT, those centred on an object with ROLE_OBJECT; ROLE_BOTH (both ends on one
# partition, or a whole query's total order) fires every pattern.  Bits: BOTH = SUBJECT | OBJECT.
ROLE_SUBJECT, ROLE_OBJECT, ROLE_BOTH = 1, 2, 3
ROLE_NAMES = {ROLE_SUBJECT: "SUBJECT", ROLE_OBJECT: "OBJECT", ROLE_BOTH: "BOTH"}  # the Avro Role enum's symbols


def partition_of(term_id: int, partitions: int) -> int:
    """The partition that keeps the state centred on a term (and receives probes for it)."""
    return term_id % partitions


def routes(s_id: int, o_id: int, partitions: int) -> tuple[tuple[int, int], ...]:
    """Where a change to ``(s, p, o)`` goes: ``(partition, role)`` pairs, the one routing function (ingest runs it).

    Stars and single-centre components are kept by the value of their centre, which is the subject or the
    object of a pattern, so a change goes to its subject's partition (``ROLE_SUBJECT``) and its object's
    (``ROLE_OBJECT``), or once with ``ROLE_BOTH`` when the two share a partition.
    """
    ps, po = s_id % partitions, o_id % partitions
    if ps == po:
        return ((ps, ROLE_BOTH),)
    return ((ps, ROLE_SUBJECT), (po, ROLE_OBJECT))


class Change(NamedTuple):
    """One effective change to a quad, as ingest numbered it."""

    seq: int  # its position in the total order: 1, 2, 3, ...
    diff: int  # INSERT (+1) or DELETE (-1)
    s: int  # term ids (cbgp.terms.stable_term_id)
    p: int
    o: int
    g: int  # DEFAULT_GRAPH_ID for the default graph
    event_time_ms: int | None = None  # for event-time windows; None: the Kafka record's time
    role: int = ROLE_BOTH
    # A repeated insert of a present quad: no change to the graph (seq is the last change's), only a newer event
    # time, which event-time windows need; every other reader skips it.
    refresh: bool = False


# A Change from a tuple of all its fields, at C speed: ``Change(...)`` runs a Python ``__new__`` (0.3 us more), and
# ingest and the codec make one per change on the data path.  (No length check: callers pass all nine fields.)
change_of = partial(tuple.__new__, Change)
