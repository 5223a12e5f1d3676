"""Control records that travel beside the changes: Frontier marks on updates.routed, ProbeBatch records of
distributed probes and acks, and ProbeReady registrations.

The ``*_of`` readers return None for any other record, from the header alone, so a data-path loop can ask
each record cheaply.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from services.codec.binary import check_flags, pack_ints, unpack_ints, unpack_signs
from services.codec.generic import decode, encode
from services.codec.registry import CodecError, writer_name

def encode_frontier(frontiers: Mapping[int, int], applied: Mapping[int, int] | None = None) -> bytes:
    """One Frontier record: routed partition -> the highest seq it has completed, and (a worker's, on
    deltas.parts) the highest it has applied, for the same partitions (see schemas/Frontier.avsc)."""
    partitions = sorted(frontiers)
    return encode("Frontier", {"partition": partitions, "seq": [frontiers[p] for p in partitions],
                               "applied": [applied[p] for p in partitions] if applied is not None else []})


def frontier_of(data: bytes) -> dict[int, int] | None:
    """The completed frontiers of a Frontier record, or None when ``data`` is another record (cheap: the
    header only)."""
    both = frontiers_of(data)
    return None if both is None else both[0]


def frontiers_of(data: bytes) -> tuple[dict[int, int], dict[int, int]] | None:
    """The completed and applied frontiers of a Frontier record (applied: as completed where the record has
    none), or None when ``data`` is another record."""
    if writer_name(data) != "Frontier":
        return None
    record = decode("Frontier", data)
    partitions, seqs, applied = record["partition"], record["seq"], record["applied"] or record["seq"]
    if not len(partitions) == len(seqs) == len(applied):
        raise CodecError("corrupt Frontier: partition, seq and applied arrays differ in length")
    return dict(zip(partitions, seqs)), {p: max(a, s) for p, s, a in zip(partitions, seqs, applied)}


_PROBE_COLUMNS = ("probe_query", "probe_seq", "probe_sign", "probe_pattern", "probe_step", "probe_width",
                  "probe_origin", "probe_snapshot", "probe_born_ms")
_ACK_COLUMNS = ("ack_query", "ack_seq", "ack_delta", "ack_snapshot")


def encode_probe_batch(probes: Sequence[Any] = (), acks: Sequence[Any] = (),
                       registered: Sequence[tuple[str, int]] = (), floors: Sequence[tuple[int, int, list[str]]] = (),
                       segments: Sequence[tuple] | None = None) -> bytes:
    """One ProbeColumns record (schemas/ProbeColumns.avsc) of ``cbgp.distributed.evaluator`` probes and acks (packed
    column by column), ``(query, as_of)`` registrations, ``(partition, floor, queries)`` floors and
    ``(sender, cause, chunk, acks, probes[, query])`` segments (how the columns divide into what each step
    made, per query)."""
    index: dict[str, int] = {}
    probe_query = [index.setdefault(p.query, len(index)) for p in probes]
    ack_query = [index.setdefault(a.query, len(index)) for a in acks]
    return encode("ProbeColumns", {
        "probes": len(probes), "acks": len(acks), "segmented": segments is not None,
        "queries": list(index), "probe_query": pack_ints("i", probe_query),
        "probe_seq": pack_ints("q", [p.seq for p in probes]), "probe_sign": pack_ints("b", [p.diff for p in probes]),
        "probe_triple": pack_ints("q", [term for p in probes for term in p.triple]),
        "probe_pattern": pack_ints("i", [p.pattern for p in probes]),
        "probe_step": pack_ints("i", [p.step for p in probes]),
        "probe_width": pack_ints("i", [len(p.binding) for p in probes]),
        "probe_binding": pack_ints("q", [term for p in probes for term in p.binding]),
        "probe_origin": pack_ints("i", [p.origin for p in probes]),
        "probe_snapshot": bytes(bool(p.snapshot) for p in probes),
        "probe_born_ms": pack_ints("q", [p.born_ms for p in probes]),
        "ack_query": pack_ints("i", ack_query), "ack_seq": pack_ints("q", [a.seq for a in acks]),
        "ack_delta": pack_ints("i", [a.delta for a in acks]), "ack_snapshot": bytes(bool(a.snapshot) for a in acks),
        "registered": [{"query": q, "as_of": as_of} for q, as_of in registered],
        "floors": [{"partition": p, "floor": f, "queries": list(qs)} for p, f, qs in floors],
        "segments": [] if segments is None else [
            {"sender": g[0], "cause": g[1], "chunk": g[2], "acks": g[3], "probes": g[4]} for g in segments],
        "segment_query": [] if segments is None or any(len(g) < 6 for g in segments) else [g[5] for g in segments],
        # (empty when every probe follows its default route: the usual record costs nothing more)
        "probe_route": pack_ints("i", [p.route for p in probes]) if any(p.route for p in probes) else b""})


def probe_batch_of(data: bytes) -> dict[str, Any] | None:
    """A ProbeBatch record decoded, or None when ``data`` is another record (cheap: the header only).
    ``probes`` are ``(query, seq, sign, triple, pattern, step, binding, origin, snapshot, born_ms, route)`` tuples
    (the fields of ``cbgp.distributed.evaluator.Probe`` after ``dest``) and ``acks``
    ``(query, seq, delta, snapshot)`` tuples, in their order; ``segments`` ``(sender, cause, chunk, acks,
    probes, query)`` tuples (query None: written before segments were per query), or None for a record written
    before segments."""
    name = writer_name(data)
    if name == "ProbeColumns":
        return _probe_columns(decode(name, data))
    if name != "ProbeBatch":
        return None
    record = decode("ProbeBatch", data)
    queries = record["queries"]
    query, seq, diff, pattern, step, width, origin, snapshot, born = [record[f] for f in _PROBE_COLUMNS]
    triples, bindings = record["probe_triple"], record["probe_binding"]
    n = len(seq)
    route = record.get("probe_route") or [0] * n
    if len(route) != n or any(len(record[f]) != n for f in _PROBE_COLUMNS) or len(triples) != 4 * n \
            or len(bindings) != sum(width) \
            or any(len(record[f]) != len(record["ack_seq"]) for f in _ACK_COLUMNS) \
            or any(not 0 <= q < len(queries) for q in query + record["ack_query"]):
        raise CodecError(f"corrupt ProbeBatch: {n} probes need {n} items in every probe_* array, {4 * n} "
                         f"probe_triple values and the sum of probe_width binding values; query indices must "
                         f"name one of the {len(queries)} queries")
    return _probe_record("ProbeBatch", record, (query, seq, diff, triples, pattern, step, width, bindings, origin,
                                                snapshot, born, route),
                         [record[f] for f in _ACK_COLUMNS], record.get("segments"))


def _probe_record(name: str, record: dict[str, Any], probe_columns: tuple, ack_columns: Sequence,
                  segments: list[dict] | None) -> dict[str, Any]:
    """probe_batch_of's answer from a record's checked columns (``(query, seq, diff, triples, pattern, step, width,
    bindings, origin, snapshot, born, route)`` and ``(query, seq, delta, snapshot)``, queries as indices), with
    the segments checked against them."""
    queries = record["queries"]
    query, seq, diff, triples, pattern, step, width, bindings, origin, snapshot, born, route = probe_columns
    probes = []
    start = 0
    for i in range(len(seq)):
        end = start + width[i]
        probes.append((queries[query[i]], seq[i], diff[i], tuple(triples[4 * i:4 * i + 4]), pattern[i], step[i],
                       tuple(bindings[start:end]), origin[i], snapshot[i], born[i], route[i]))
        start = end
    acks = [(queries[q], s, d, snap) for q, s, d, snap in zip(*ack_columns)]
    if segments is not None:
        named = record.get("segment_query") or [None] * len(segments)
        if len(named) != len(segments):
            raise CodecError(f"corrupt {name}: {len(named)} segment queries for {len(segments)} segments")
        segments = [(g["sender"], g["cause"], g["chunk"], g["acks"], g["probes"], query)
                    for g, query in zip(segments, named)]
        if sum(g[3] for g in segments) != len(acks) or sum(g[4] for g in segments) != len(probes):
            raise CodecError(f"corrupt {name}: its segments count {sum(g[3] for g in segments)} acks and "
                             f"{sum(g[4] for g in segments)} probes, the record holds {len(acks)} and {len(probes)}")
    return {"probes": probes, "acks": acks, "registered": record["registered"], "floors": record["floors"],
            "segments": segments}


def _probe_columns(record: dict[str, Any]) -> dict[str, Any]:
    """probe_batch_of for a ProbeColumns record: every column checked against its count."""
    name, n, n_acks, queries = "ProbeColumns", record["probes"], record["acks"], record["queries"]
    if n < 0 or n_acks < 0:
        raise CodecError(f"corrupt {name}: {n} probes, {n_acks} acks")

    def column(field: str, code: str, count: int = n) -> Any:
        return unpack_ints(code, record[field], count, name, field)

    query, seq, pattern, step = column("probe_query", "i"), column("probe_seq", "q"), column("probe_pattern", "i"), \
        column("probe_step", "i")
    diff = unpack_signs(record["probe_sign"], n, name, "probe_sign")
    width, origin, born = column("probe_width", "i"), column("probe_origin", "i"), column("probe_born_ms", "q")
    snapshot = list(map(bool, check_flags(record["probe_snapshot"], n, name, "probe_snapshot")))
    triples = column("probe_triple", "q", 4 * n)
    if min(width, default=0) < 0:
        raise CodecError(f"corrupt {name}: a negative probe_width")
    bindings = column("probe_binding", "q", sum(width))
    route = unpack_ints("i", record["probe_route"], n, name, "probe_route", optional=True) or [0] * n
    ack_query, ack_seq, ack_delta = column("ack_query", "i", n_acks), column("ack_seq", "q", n_acks), \
        column("ack_delta", "i", n_acks)
    ack_snapshot = list(map(bool, check_flags(record["ack_snapshot"], n_acks, name, "ack_snapshot")))
    bounds = [bound for indices in (query, ack_query) if indices for bound in (min(indices), max(indices))]
    if bounds and not 0 <= min(bounds) <= max(bounds) < len(queries):
        raise CodecError(f"corrupt {name}: query indices must name one of the {len(queries)} queries")
    segments = record["segments"] if record["segmented"] else None
    return _probe_record(name, record, (query, seq, diff, triples, pattern, step, width, bindings, origin, snapshot,
                                        born, route), (ack_query, ack_seq, ack_delta, ack_snapshot), segments)


def encode_probe_ready(query_id: str, version: int, partition: int, as_of: int) -> bytes:
    return encode("ProbeReady", {"query_id": query_id, "version": version, "partition": partition, "as_of": as_of})


def probe_ready_of(data: bytes | None) -> dict[str, Any] | None:
    """A ProbeReady record decoded, or None when ``data`` is another record."""
    if data is None or writer_name(data) != "ProbeReady":
        return None
    return decode("ProbeReady", data)
