"""Avro ``Answer`` records read column by column, and ``CurrentAnswer`` records written the same way.

How it works: docs/design/internals.md, spark.answer_columns.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from services import codec

ANSWER_HEADER = codec.MAGIC + codec.fingerprint("Answer")
CURRENT_HEADER = codec.MAGIC + codec.fingerprint("CurrentAnswer")
_PAD = 16
_MAX_MAP_STEPS = 4096

# The decoded form, one row per record: ``bidx`` indexes the batch's distinct canonical bindings
# (``bindings``, ``avro``), so the fold groups by integers, not strings.
DECODED_FIELDS = ("query_id", "n", "sign", "version", "bidx", "partition", "error")


class _Cursor:
    """Positions in every record of a binary column; reads advance the selected records only."""

    def __init__(self, values: pa.Array) -> None:
        values = values.cast(pa.large_binary()) if not pa.types.is_large_binary(values.type) else values
        n = len(values)
        offsets = np.frombuffer(values.buffers()[1], dtype=np.int64)[values.offset: values.offset + n + 1]
        data_buf = values.buffers()[2]
        data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        self.data = np.concatenate([data, np.zeros(_PAD, np.uint8)])
        self.limit = len(self.data) - 1
        self.start = offsets[:-1].copy()
        self.end = offsets[1:].copy()
        self.pos = self.start.copy()
        self.ok = values.is_valid().to_numpy(zero_copy_only=False).copy() if values.null_count else np.ones(n, bool)

    def _at(self, pos: np.ndarray) -> np.ndarray:
        return self.data[np.minimum(pos, self.limit)]

    def byte(self, mask: np.ndarray) -> np.ndarray:
        m = mask & self.ok
        self.ok &= ~m | (self.pos < self.end)
        b = self._at(self.pos).astype(np.int64)
        self.pos[m] += 1
        return b

    def varint(self, mask: np.ndarray) -> np.ndarray:
        """Avro long (zig-zag varint) at each selected record's position."""
        cont = mask & self.ok
        z = np.zeros(len(self.pos), np.uint64)
        shift = np.uint64(0)
        for _ in range(10):
            if not cont.any():
                break
            inside = self.pos < self.end
            self.ok &= ~cont | inside
            cont &= inside
            b = self._at(self.pos).astype(np.uint64)
            z[cont] |= (b[cont] & np.uint64(0x7F)) << shift
            self.pos[cont] += 1
            cont &= (b & np.uint64(0x80)) != 0
            shift += np.uint64(7)
        self.ok &= ~cont  # more than 10 bytes: not a long
        return (z >> np.uint64(1)).astype(np.int64) ^ -(z & np.uint64(1)).astype(np.int64)

    def string(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of the Avro string/bytes at each selected record; skips it."""
        length = self.varint(mask)
        m = mask & self.ok
        self.ok &= ~m | ((length >= 0) & (self.pos + length <= self.end))
        m &= self.ok
        length = np.where(m, length, 0)
        start = self.pos.copy()
        self.pos += length
        return start, length

    def optional_string(self, mask: np.ndarray) -> None:
        branch = self.varint(mask)
        m = mask & self.ok
        self.ok &= ~m | (branch == 0) | (branch == 1)
        self.string(m & (branch == 1))


def _gather(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, kind: pa.DataType) -> pa.Array:
    """The byte ranges ``[starts, starts + lengths)`` of ``data`` as one Arrow string/binary array."""
    lengths = lengths.astype(np.int64)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # index of every output byte in data: runs of +1 steps, each run jumping to its range's start
    nonempty = np.flatnonzero(lengths)
    kind_index = np.int32 if len(data) < 2**31 - 1 else np.int64
    step = np.ones(offsets[-1], kind_index)
    if len(nonempty):
        begin = starts[nonempty].astype(np.int64)
        prev_last = np.r_[0, (begin + lengths[nonempty] - 1)[:-1]]  # the index of the byte before
        step[offsets[:-1][nonempty]] = begin - prev_last
    flat = data[np.cumsum(step, out=step)]
    large = pa.large_string() if kind == pa.string() else pa.large_binary()
    arr = pa.Array.from_buffers(large, len(lengths), [None, pa.py_buffer(offsets), pa.py_buffer(flat)])
    return arr.cast(kind) if offsets[-1] < 2**31 - 1 else arr


def _read_map(cur: _Cursor, mask: np.ndarray) -> None:
    """Skip the Avro ``map<SparqlTerm>`` at each selected record (blocks of entries until a 0 count)."""
    remaining = np.zeros(len(mask), np.int64)
    active = mask & cur.ok
    for _ in range(_MAX_MAP_STEPS):
        active &= cur.ok
        if not active.any():
            return
        need = active & (remaining == 0)
        if need.any():
            count = cur.varint(need)
            need &= cur.ok
            active &= ~(need & (count == 0))
            negative = need & (count < 0)
            if negative.any():
                cur.varint(negative)  # a block with a negative count carries its size in bytes
            remaining[need] = np.abs(count[need])
        entry = active & cur.ok & (remaining > 0)
        if entry.any():
            cur.string(entry)  # variable name
            kind = cur.varint(entry)
            cur.ok &= ~entry | ((kind >= 0) & (kind <= 2))
            cur.string(entry)  # value
            cur.optional_string(entry)  # datatype
            cur.optional_string(entry)  # lang
            remaining[entry] -= 1
    cur.ok &= ~active  # absurdly many entries


# ---------------------------------------------------------------- bindings


def _py_varint(data: bytes, pos: int) -> tuple[int, int]:
    z = shift = 0
    while True:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return (z >> 1) ^ -(z & 1), pos


def _py_text(data: bytes, pos: int) -> tuple[str, int]:
    size, pos = _py_varint(data, pos)
    return data[pos: pos + size].decode("utf-8"), pos + size


_TERM_TYPES = ("uri", "literal", "bnode")


def binding_of_avro(raw: bytes) -> dict[str, dict[str, Any]]:
    """The Avro binding map ``{var: SparqlTerm}`` in ``raw`` (a current-schema map, as checked by the reader)."""
    out: dict[str, dict[str, Any]] = {}
    pos = 0
    while True:
        count, pos = _py_varint(raw, pos)
        if count == 0:
            return out
        if count < 0:
            count = -count
            _size, pos = _py_varint(raw, pos)
        for _ in range(count):
            var, pos = _py_text(raw, pos)
            kind, pos = _py_varint(raw, pos)
            value, pos = _py_text(raw, pos)
            term: dict[str, Any] = {"type": _TERM_TYPES[kind], "value": value, "datatype": None, "lang": None}
            for field in ("datatype", "lang"):
                branch, pos = _py_varint(raw, pos)
                if branch == 1:
                    term[field], pos = _py_text(raw, pos)
            out[var] = term


def canonical_binding(binding: Mapping[str, Mapping[str, Any] | None]) -> str:
    """Canonical JSON of an Avro binding ``{var: SparqlTerm}`` (unbound variables left out)."""
    return codec.canonical_binding({var: codec.term_from_avro(term) for var, term in binding.items()
                                    if term is not None})


_CANONICAL: dict[bytes, str] = {}
_CANONICAL_MAX = 1 << 20


def _canonical_of_avro(raw: bytes) -> str:
    found = _CANONICAL.get(raw)
    if found is None:
        found = canonical_binding(binding_of_avro(raw))
        if len(_CANONICAL) >= _CANONICAL_MAX:
            _CANONICAL.clear()
        _CANONICAL[raw] = found
    return found


class Bindings:
    """The distinct canonical bindings of a batch, each with one Avro encoding of it (None: not known)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.canonical: list[str] = []
        self.avro: list[bytes | None] = []

    def add(self, canonical: str, avro: bytes | None) -> int:
        i = self.index.get(canonical)
        if i is None:
            i = self.index[canonical] = len(self.canonical)
            self.canonical.append(canonical)
            self.avro.append(avro)
        elif self.avro[i] is None:
            self.avro[i] = avro
        return i


# ---------------------------------------------------------------- Answer records -> columns


def decode_answer_values(values: pa.Array, partitions: pa.Array | None = None, offsets: pa.Array | None = None,
                         bindings: Bindings | None = None) -> tuple[pa.Table, Bindings]:
    """Answer record values -> (table of ``DECODED_FIELDS``, the bindings ``bidx`` points into).

    Null values (tombstones) are skipped.  A record that no decoder can read keeps a row with ``error`` set
    (``"partition P offset O: <exception>"``) and nulls elsewhere."""
    bindings = bindings if bindings is not None else Bindings()
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    keep = values.is_valid()
    if values.null_count:
        values = values.filter(keep)
        partitions = None if partitions is None else pc.filter(partitions, keep)
        offsets = None if offsets is None else pc.filter(offsets, keep)
    n = len(values)
    cur = _Cursor(values)
    everyone = np.ones(n, bool)
    head_ok = (cur.end - cur.start) >= len(ANSWER_HEADER)
    for k, byte in enumerate(ANSWER_HEADER):
        head_ok &= cur._at(cur.start + k) == byte
    cur.ok &= head_ok
    cur.pos += len(ANSWER_HEADER)
    q_start, q_len = cur.string(everyone)
    n_col = cur.varint(everyone)
    cur.varint(everyone)  # seq
    s_start, s_len = cur.string(everyone)
    sign_byte = cur._at(s_start)
    cur.ok &= (s_len == 1) & ((sign_byte == ord("+")) | (sign_byte == ord("-")))
    b_start = cur.pos.copy()
    _read_map(cur, everyone)
    b_len = cur.pos - b_start
    flag = cur.byte(everyone)
    cur.ok &= flag <= 1
    cur.varint(everyone)  # produced_at_ms
    version = cur.varint(everyone)
    cur.ok &= (cur.pos == cur.end) & (version >= -(2**31)) & (version < 2**31)
    fast = cur.ok
    query_ids = _gather(cur.data, np.where(fast, q_start, 0), np.where(fast, q_len, 0), pa.string()) \
        if fast.all() else None
    if query_ids is not None:
        try:
            query_ids.validate(full=True)
        except pa.ArrowInvalid:  # invalid UTF-8 somewhere: those records take the slow path
            query_ids = None
    if query_ids is None:
        for i in np.flatnonzero(fast):
            try:
                bytes(cur.data[q_start[i]: q_start[i] + q_len[i]]).decode("utf-8")
            except UnicodeDecodeError:
                fast[i] = False
        query_ids = _gather(cur.data, np.where(fast, q_start, 0), np.where(fast, q_len, 0), pa.string())
    raw_bindings = _gather(cur.data, np.where(fast, b_start, 0), np.where(fast, b_len, 0), pa.binary())
    encoded = pc.dictionary_encode(raw_bindings)
    distinct = encoded.dictionary.to_pylist()
    to_index = np.empty(len(distinct), np.int64)
    bad_binding = np.zeros(len(distinct), bool)
    for j, raw in enumerate(distinct):
        try:
            to_index[j] = bindings.add(_canonical_of_avro(raw), raw)
        except (IndexError, UnicodeDecodeError, ValueError) as exc:  # noqa: PERF203 - rare
            bad_binding[j] = True
            to_index[j] = -1
            del exc
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    fast &= ~bad_binding[codes] if len(distinct) else fast
    bidx = np.where(fast, to_index[codes] if len(distinct) else 0, -1)
    diff = np.where(sign_byte == ord("+"), 1, -1).astype(np.int8)
    error: list[str | None] = [None] * n
    slow = np.flatnonzero(~fast)
    py_values = {}
    if len(slow):
        q_list = query_ids.to_pylist()
        n_col, version, bidx = n_col.copy(), version.copy(), bidx.copy()
        part_list = None if partitions is None else partitions.to_pylist()
        off_list = None if offsets is None else offsets.to_pylist()
        for i in slow:
            value = values[int(i)].as_py()
            try:
                rec = codec.decode("Answer", value)
                s = {"+": 1, "-": -1}[rec["sign"]]
                terms = {var: codec.term_from_avro(t) for var, t in rec["binding"].items() if t is not None}
                bidx[i] = bindings.add(codec.canonical_binding(terms), codec.answer_binding(terms))
                q_list[i], n_col[i], diff[i], version[i] = rec["query_id"], int(rec["n"]), s, int(rec["version"])
            except Exception as exc:  # noqa: BLE001 - reported per record, never stops the job
                where = f"partition {part_list[i] if part_list else None} offset {off_list[i] if off_list else None}"
                error[i] = f"{where}: {exc!r}"[:500]
                q_list[i] = None
        query_ids = pa.array(q_list, pa.string())
        py_values = {"error": pa.array(error, pa.string())}
    bad = np.array([e is not None for e in error], bool) if py_values else np.zeros(n, bool)
    table = pa.table({
        "query_id": query_ids,
        "n": pa.array(n_col, pa.int64(), mask=bad),
        "sign": pa.array(diff, pa.int8(), mask=bad),
        "version": pa.array(version.astype(np.int32), pa.int32(), mask=bad),
        "bidx": pa.array(bidx.astype(np.int32), pa.int32(), mask=bad),
        "partition": partitions.cast(pa.int32()) if partitions is not None else pa.nulls(n, pa.int32()),
        "error": py_values.get("error", pa.nulls(n, pa.string())),
    })
    return table, bindings


# ---------------------------------------------------------------- CurrentAnswer records from columns


def _varints(values: np.ndarray) -> pa.Array:
    """Avro longs (zig-zag varints) of ``values`` as one binary array."""
    v = values.astype(np.int64)
    z = ((v << 1) ^ (v >> 63)).astype(np.uint64)
    size = np.ones(len(z), np.int64)
    rest = z >> np.uint64(7)
    while rest.any():
        size += rest != 0
        rest >>= np.uint64(7)
    offsets = np.zeros(len(z) + 1, np.int64)
    np.cumsum(size, out=offsets[1:])
    flat = np.zeros(offsets[-1], np.uint8)
    for k in range(int(size.max()) if len(size) else 0):
        has = size > k
        byte = (z[has] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = size[has] > k + 1
        flat[offsets[:-1][has] + k] = (byte | np.where(more, np.uint64(0x80), np.uint64(0))).astype(np.uint8)
    arr = pa.Array.from_buffers(pa.large_binary(), len(z), [None, pa.py_buffer(offsets), pa.py_buffer(flat)])
    return arr.cast(pa.binary())


def _avro_string(text: str) -> bytes:
    data = text.encode("utf-8")
    return _varints(np.array([len(data)]))[0].as_py() + data


def _per_query(query_ids: pa.Array, make: Any, kind: pa.DataType) -> pa.Array:
    """``make(query_id)`` for every row, computed once per distinct query id."""
    encoded = pc.dictionary_encode(query_ids)
    if isinstance(encoded, pa.ChunkedArray):
        encoded = encoded.combine_chunks()
    table = pa.array([make(q) for q in encoded.dictionary.to_pylist()], kind)
    return table.take(encoded.indices)


def current_answer_columns(changed: pa.Table, avro: Sequence[bytes | None] | None = None) -> tuple[pa.Array, pa.Array]:
    """``(key, value)`` binary arrays of answers.current records for ``changed`` rows (``query_id, binding,
    multiplicity, last_n, version`` and ``bidx``, an index into ``avro``, the bindings' Avro bytes).

    The bytes equal ``codec.current_key`` and ``codec.encode_current_answer`` (up to the order of the
    binding map's entries); a binding with multiplicity <= 0 gets a tombstone (null value)."""
    n = changed.num_rows
    if n == 0:
        return pa.array([], pa.binary()), pa.array([], pa.binary())
    queries = changed.column("query_id").combine_chunks()
    binding = changed.column("binding").combine_chunks()
    prefix = _per_query(queries, lambda q: "[" + codec.json_string(q) + ",", pa.string())
    keys = pc.binary_join_element_wise(prefix, binding, pa.array(["]"] * n, pa.string()), "").cast(pa.binary())
    if avro is not None and "bidx" in changed.column_names:
        bidx = changed.column("bidx").combine_chunks()
        reps = pa.array(list(avro), pa.binary())
        body = reps.take(pc.fill_null(bidx, 0)) if len(reps) else pa.nulls(n, pa.binary())
        body = pc.if_else(pc.is_null(bidx), pa.nulls(n, pa.binary()), body)
    else:
        body = pa.nulls(n, pa.binary())
    multiplicity = changed.column("multiplicity").to_numpy()
    missing = np.flatnonzero(pc.is_null(body).to_numpy(zero_copy_only=False) & (multiplicity > 0))
    if len(missing):  # no Avro bytes at hand (a DataFrame of canonical bindings): encode those one by one
        filled = body.to_pylist()
        texts = binding.to_pylist()
        for i in missing:
            filled[i] = codec.answer_binding(json.loads(texts[i]))
        body = pa.array(filled, pa.binary())
    header = pa.array([CURRENT_HEADER] * n, pa.binary())
    qid = _per_query(queries, _avro_string, pa.binary())
    value = pc.binary_join_element_wise(
        header, qid, body, _varints(multiplicity), _varints(changed.column("last_n").to_numpy()),
        _varints(changed.column("version").to_numpy()), b"")
    value = pc.if_else(pa.array(multiplicity > 0), value, pa.nulls(n, pa.binary()))
    return keys, value
