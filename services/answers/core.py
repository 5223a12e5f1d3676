"""The answers service's transform, with no Kafka in it: deltas.parts records in, numbered answers and
current answers out.

Per query it numbers deltas in arrival order, drops duplicates by idempotence key (per (query, source
partition) the key must increase), decodes term ids and maintains multiplicities.  Every registration of a
query id is its own stream, numbered from n = 1; a stream ends when its query is unregistered or registered
again, and its current answers are retracted in it.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from prometheus_client import Gauge

from cbgp.query.limits import limit
from services import codec
from services.codec import canonical_binding, current_key, term_from_avro
from services.metrics.instruments import ANSWER_LATENCY, DELTAS_EMITTED, QueryLabels
from services.wire.idempotence import ORDERED_SOURCE_BELOW
from services.wire.records import (ANSWER_OVERHEAD_BYTES, DEFAULT_MAX_RECORD_BYTES, ORIGIN_HEADER, RECORD_SETTING,
                                   WHOLE_QUERY_PART, Output, dead_letter)
from services.wire.loglines import kv

log = logging.getLogger("cbgp.answers")


NOTHING_SEEN = (-(1 << 64),) * 3  # below every (seq, offset, index) key, whatever a source numbers from

SERVICE = "answers"
SOURCE_HEADER = "cbgp-src"  # "<source_partition>:<source_offset>:<index>" of the PartDelta behind an Answer
HELD_DELTAS = Gauge("cbgp_held_deltas", "By-centre answer deltas held until every routed partition's frontier "
                    "passes their seq (services.answers.release).")
RELEASE_FRONTIER = Gauge("cbgp_release_frontier_seq", "Highest seq a routed partition has completed, as the answers "
                         "service's release sees it (the lowest over its deltas.parts partitions).", ["partition"])
GATES_WAITING = Gauge("cbgp_gates_waiting", "Gated registrations waiting for a routed partition's ProbeReady mark "
                      "(services.answers.release).", ["partition"])
TERM_CACHE_MAX = 1 << 18


@dataclass
class QueryAnswers:
    """The answer stream of one registration (version) of one query."""

    n: int = 0
    current: dict[str, list] = field(default_factory=dict)  # binding json -> [multiplicity, last_n]
    # source partition -> its last idempotence key taken: (seq, offset, index) for routed sources, whose deltas
    # are released in seq order (probes make a partition's offsets and seqs disagree), (-1, offset, index) for
    # the ordered ones
    last_key: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    version: int = 0  # QueryPlan.version of the registration (0: unknown, written before versions: adopted)
    seq: int = 0  # highest seq of its answers (the seq of the retractions that end the stream)


class AnswersCore:
    """Numbering, deduplication, decoding and multiplicities of every query of the assigned partitions."""

    def __init__(self, answers_topic: str, current_topic: str, deadletter_topic: str, source_topic: str) -> None:
        self.t_answers = answers_topic
        self.t_current = current_topic
        self.t_deadletter = deadletter_topic
        self.t_source = source_topic
        self.max_binding = limit(RECORD_SETTING, DEFAULT_MAX_RECORD_BYTES) - ANSWER_OVERHEAD_BYTES
        self.queries: dict[str, QueryAnswers] = {}
        self.partition_of: dict[str, int] = {}
        self.duplicates = 0
        self.stale = 0  # deltas of a version older than the query's (or of an unregistered one), dropped
        # What queries.plans says (see on_plan): the version of each registered query, and per unregistered or
        # re-registered id the highest version whose stream has ended (its deltas are dropped from then on).
        self.plan_version: dict[str, int] = {}
        # query id -> version -> its query (product assemblers), its plan's query class: the registrations whose
        # stream has not ended (a query registered again and again keeps its current text only)
        self.texts: dict[str, dict[int, str]] = {}
        self.classes: dict[str, dict[int, str]] = {}
        self.ended: dict[str, int] = {}
        self.unsettled = False  # a plan or a restore may have left a stream to end: call settle()
        self.emitted: dict[tuple[str, str], object] = {}  # (query, sign) -> its DELTAS_EMITTED child
        self.query_labels = QueryLabels()  # at most CBGP_METRICS_QUERY_LABELS series of their own
        # term id -> (canonical JSON, Avro SparqlTerm body): answers repeat terms (ids are stable, so an entry
        # never goes stale; the cache is emptied when full)
        self._terms: dict[int, tuple[str, bytes]] = {}

    def drop_partition(self, partition: int) -> None:
        for name in [q for q, p in self.partition_of.items() if p == partition]:
            del self.queries[name]
            del self.partition_of[name]

    def restore(self, partition: int, value: bytes, headers: dict[str, bytes]) -> None:
        """Re-apply one Answer already produced (restore of the numbering, multiplicities and dedupe keys).

        Only the latest version's stream is kept: an answer of a newer version replaces the state (the older
        stream was ended, or is ended by :meth:`settle`), one of an older version is skipped."""
        record = codec.decode("Answer", value)
        name, version = record["query_id"], record["version"]
        state = self.queries.get(name)
        if state is None or (version > state.version and state.version != 0):
            state = self.queries[name] = QueryAnswers(version=version)
        elif version < state.version and version != 0:
            return
        elif state.version == 0:
            state.version = version  # records written before versions carry on in the first versioned stream
        self.partition_of[name] = partition
        self.unsettled = True
        state.n = max(state.n, record["n"])
        state.seq = max(state.seq, record["seq"])
        src = headers.get(SOURCE_HEADER)
        if src:
            p, offset, index = (int(x) for x in src.decode().split(":"))
            key = (record["seq"] if p >= ORDERED_SOURCE_BELOW else -1, offset, index)
            state.last_key[p] = max(state.last_key.get(p, NOTHING_SEEN), key)
        terms = {var: term_from_avro(t) for var, t in record["binding"].items()}
        key = canonical_binding(terms)
        entry = state.current.setdefault(key, [0, 0])
        entry[0] += 1 if record["sign"] == "+" else -1
        entry[1] = record["n"]
        if entry[0] <= 0:
            del state.current[key]

    def on_record(self, partition: int, offset: int, value: bytes, origin: int | None,
                  lookup: Callable[[int], str | None], deltas: codec.PartDeltaColumns | None = None) -> list[Output]:
        """The outputs of one deltas.parts record (a PartDeltaColumns or one PartDelta): per delta an Answer
        and the new CurrentAnswer (or tombstone); a dead letter for a record that does not decode or names a
        term id the dictionary does not have.  ``deltas``: ``value`` already decoded (``None``: decode here)."""
        if deltas is None:
            try:
                deltas = codec.part_delta_columns(value)
            except codec.CodecError as exc:
                return [self._dead(partition, offset, "schema-mismatch", str(exc), value)]
        if deltas.part != WHOLE_QUERY_PART:
            return []  # one part of a multi-part query: input of the Spark assembly, which sends the answers
        name = deltas.query_id
        out: list[Output] = []
        state = self.queries.get(name)
        # Deltas without a version (the Spark job's, records written before versions) belong to the version
        # the query has now.
        version = deltas.version or (state.version if state is not None else self.plan_version.get(name, 0))
        if self._stale(name, version, state):
            self.stale += len(deltas)  # an unregistered or replaced registration's deltas still in flight
            return out
        if state is None:
            state = self.queries[name] = QueryAnswers(version=version)
        elif version > state.version:
            if state.version:  # a new registration: its stream starts at n = 1, the old one ends
                out.extend(self._end(name, state))
                state = self.queries[name] = QueryAnswers(version=version)
            else:
                state.version = version
        self.partition_of[name] = partition
        variables = deltas.variables
        k = len(variables)
        # Canonical JSON and Avro maps list the variables sorted; terms are looked up once per id.
        order = sorted(range(k), key=variables.__getitem__)
        var_json = [codec.json_string(variables[j]) + ":" for j in order]
        writer = codec.BindingWriter([variables[j] for j in order])
        terms = self._terms
        now = int(time.time() * 1000)
        latency = max(0, now - origin) / 1000 if origin is not None else None
        origin_text = str(origin).encode()
        name_key = name.encode()
        version = state.version
        values, diffs, seqs, snapshots = deltas.values, deltas.diff, deltas.seq, deltas.snapshot
        emitted = {"+": 0, "-": 0}
        for i in range(len(deltas)):
            src = deltas.source_partition[i]
            key = (seqs[i] if src >= ORDERED_SOURCE_BELOW else -1, deltas.source_offset[i], deltas.index[i])
            if key <= state.last_key.get(src, NOTHING_SEEN):
                self.duplicates += 1
                continue
            row = values[i * k:(i + 1) * k]
            encoded: list[tuple[str, bytes]] = []  # (canonical JSON, Avro SparqlTerm body) per sorted variable
            for j in order:
                term = terms.get(row[j])
                if term is None:
                    text = lookup(row[j])
                    if text is None:
                        break
                    if len(terms) >= TERM_CACHE_MAX:
                        terms.clear()
                    term = terms[row[j]] = (codec.json_string(text), writer.term_body(text))
                encoded.append(term)
            if len(encoded) < k:
                missing = order[len(encoded)]
                out.append(self._dead(partition, offset, "unknown-term", f"query {name}: term id {row[missing]} "
                                      f"of ?{variables[missing]} is not in the dictionary", value))
                continue
            binding = writer.write([body for _json, body in encoded])
            if len(binding) > self.max_binding:  # (the registry's check makes this a last resort)
                state.last_key[src] = key
                out.append(self._dead(partition, offset, "answer-too-large", f"query {name}: an answer of "
                                      f"{len(binding):,} bytes does not fit in a record ({RECORD_SETTING})", b""))
                continue
            state.last_key[src] = key
            state.n += 1
            if seqs[i] > state.seq:
                state.seq = seqs[i]
            sign = "+" if diffs[i] > 0 else "-"  # the Answer record's sign
            emitted[sign] += 1
            headers = [(SOURCE_HEADER, f"{src}:{key[1]}:{key[2]}".encode())]
            if latency is not None:
                headers.append((ORIGIN_HEADER, origin_text))
                ANSWER_LATENCY.observe(latency)
            out.append(Output(self.t_answers, codec.encode_answer_record(
                name, state.n, seqs[i], sign, binding, snapshots[i], now, version), name_key, partition, headers))
            binding_json = "{" + ",".join([vj + tj for vj, (tj, _body) in zip(var_json, encoded)]) + "}"
            entry = state.current.setdefault(binding_json, [0, 0])
            entry[0] += 1 if sign == "+" else -1
            entry[1] = state.n
            ckey = current_key(name, binding_json)
            if entry[0] <= 0:
                if entry[0] < 0:
                    log.warning(kv(event="negative-multiplicity", query=name, binding=binding_json))
                del state.current[binding_json]
                out.append(Output(self.t_current, None, ckey, partition))
            else:
                out.append(Output(self.t_current, codec.encode_current_answer_record(
                    name, binding, entry[0], state.n, version), ckey, partition))
        for sign, count in emitted.items():
            if count:
                counter = self.emitted.get((name, sign))
                if counter is None:  # labels() costs microseconds: once per query and sign
                    counter = self.emitted[(name, sign)] = DELTAS_EMITTED.labels(self.query_labels.label(name), sign)
                counter.inc(count)
        return out

    def _stale(self, name: str, version: int, state: QueryAnswers | None) -> bool:
        """Deltas of ``version`` belong to an ended stream: an older registration, or an unregistered one."""
        if version == 0:  # unversioned, with no stream to join: only a registered query gets a new one
            return state is None and name in self.ended and name not in self.plan_version
        return self.superseded(name, version) or (state is not None and version < state.version)

    def superseded(self, query_id: str, version: int) -> bool:
        """Whether queries.plans has ended registration ``version`` (> 0) of ``query_id``: unregistered, or
        registered again with a newer version (its deltas still in flight are dropped)."""
        return version <= self.ended.get(query_id, 0) or version < self.plan_version.get(query_id, 0)

    def note_registration(self, query_id: str, version: int, text: str, query_class: str | None) -> None:
        """A registration's query and its plan's query class, kept until its stream ends."""
        if self.superseded(query_id, version):
            return
        self.texts.setdefault(query_id, {})[version] = text
        if query_class is not None:
            self.classes.setdefault(query_id, {})[version] = query_class

    def text_of(self, query_id: str, version: int) -> str | None:
        return self.texts.get(query_id, {}).get(version)

    def class_of(self, query_id: str, version: int) -> str | None:
        return self.classes.get(query_id, {}).get(version)

    def _forget_ended(self, query_id: str) -> None:
        """Let go of the texts of the registrations of ``query_id`` queries.plans has ended."""
        for kept in (self.texts, self.classes):
            versions = kept.get(query_id)
            for version in [v for v in versions or () if self.superseded(query_id, v)]:
                del versions[version]
            if versions == {}:
                del kept[query_id]

    def on_plan(self, query_id: str, version: int | None, ended: int | None = None) -> None:
        """One queries.plans record: a plan of ``version``, or (``version`` None) a tombstone, which ends the
        registration ``ended`` (its version when known, else every version this service has seen of the id).
        A stream it ends is retracted by the next :meth:`settle`."""
        if version is not None:
            self.plan_version[query_id] = max(version, self.plan_version.get(query_id, 0))
        else:
            last = self.plan_version.pop(query_id, None)
            if ended is None:
                ended = last
            if ended is None:
                state = self.queries.get(query_id)
                ended = state.version if state is not None else None
            if ended is not None:
                self.ended[query_id] = max(ended, self.ended.get(query_id, 0))
        self._forget_ended(query_id)
        self.unsettled = True

    def settle(self, partitions: set[int] | None = None) -> list[Output]:
        """End every held stream that queries.plans has left behind: its query was unregistered, or registered
        again with a newer version.  Its current answers are retracted (see :meth:`_end`) and its state is
        forgotten (the ended version is remembered, so its deltas still in flight are dropped).  Only streams
        of ``partitions`` (None: all) are ended; the others wait for a later call."""
        out: list[Output] = []
        if not self.unsettled:
            return out
        self.unsettled = False
        for name in list(self.queries):
            state = self.queries[name]
            if partitions is not None and self.partition_of[name] not in partitions:
                self.unsettled = True  # a revoked partition's state, kept for an unchanged re-assignment
                continue
            registered = self.plan_version.get(name)
            if state.version and (state.version <= self.ended.get(name, 0)
                                  or registered is not None and state.version < registered):
                out.extend(self._end(name, state))
                del self.queries[name]
                del self.partition_of[name]
            elif not state.version and name in self.ended and registered is None:
                out.extend(self._end(name, state))  # a stream from before versions, unregistered
                del self.queries[name]
                del self.partition_of[name]
        return out

    def _end(self, name: str, state: QueryAnswers) -> list[Output]:
        """The end of one registration's stream: a "-" Answer (numbered on in that stream, at the highest seq
        it reached) per unit of multiplicity of each current answer, and its answers.current tombstone; so
        the stream sums to nothing for any reader that folds it (restore, compaction, ``cbgp watch``)."""
        self.ended[name] = max(state.version, self.ended.get(name, 0))
        self._forget_ended(name)
        for sign in "+-":  # its series go with it
            self.emitted.pop((name, sign), None)
        if self.query_labels.forget(name):
            for sign in "+-":
                try:
                    DELTAS_EMITTED.remove(name, sign)
                except KeyError:
                    pass
        partition = self.partition_of[name]
        now = int(time.time() * 1000)
        out: list[Output] = []
        for binding_json, (multiplicity, _last_n) in sorted(state.current.items()):
            binding = codec.answer_binding(json.loads(binding_json))
            for _ in range(multiplicity):
                state.n += 1
                out.append(Output(self.t_answers, codec.encode_answer_record(
                    name, state.n, state.seq, "-", binding, False, now, state.version), name.encode(), partition))
            out.append(Output(self.t_current, None, current_key(name, binding_json), partition))
        if state.current:
            log.info(kv(event="stream-ended", query=name, version=state.version, retracted=len(state.current)))
        state.current.clear()
        return out

    def refused(self, partition: int, offset: int, message: str, value: bytes) -> Output:
        """The dead letter of a deltas.parts record that does not decode (``message``: what is wrong)."""
        return self._dead(partition, offset, "schema-mismatch", message, value)

    def _dead(self, partition: int, offset: int, reason: str, message: str, value: bytes) -> Output:
        return dead_letter(self.t_deadletter, SERVICE, self.t_source, partition, offset, reason, message, value)


# ---------------------------------------------------------------------------------------- Kafka loop
