"""The gateway's topic side: what it reads (``queries.plans``, ``answers``; ``updates.encoded`` and ``dictionary``
for ``POST /query``) and what it writes (``updates.raw`` for ``POST /update``, ``admin`` for register/unregister).

How it works: docs/design/internals.md, services.gateway.kafka_io.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary, to_oxigraph
from services import codec
from services.codec import sparql_json_term
from services.gateway.core import Answer, Share
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_producer
from services.kafka.fetch import Fetcher
from services.state.forked import ForkedJob

__all__ = ["FleetSampler", "Follower", "GraphSource", "Publisher"]

log = logging.getLogger(__name__)

Batch = list[tuple[str, Any]]  # ("plan", (query_id, plan | None)) or ("answer", Answer), in topic order


def decode_answer(value: bytes) -> Answer:
    r = codec.decode_answer_json(value)
    return Answer(r["n"], r["sign"], r["binding"], r["seq"], r["snapshot"], r["produced_at_ms"], r["version"],
                  r["query_id"], key=r["key"])


class Follower(threading.Thread):
    """Reads every plan, and the answers of the partitions in ``share``, for ever; ``deliver(batch)`` is called in
    this thread (it must hand over to the event loop itself, e.g. with ``loop.call_soon_threadsafe``).  The first
    batch is ``[("partitions", count)]``: how many partitions ``answers`` has."""

    def __init__(self, settings: KafkaSettings, deliver: Callable[[Batch], None], share: Share = Share()) -> None:
        super().__init__(name="gateway-follower", daemon=True)
        self.settings = settings
        self.deliver = deliver
        self.share = share
        self.stopping = False
        self.ready = threading.Event()
        self.records = 0
        self.undecodable = 0

    def run(self) -> None:
        settings = self.settings
        t_plans, t_answers = settings.topic("queries.plans"), settings.topic("answers")
        targets: dict[tuple[str, int], int] = {}
        starts: dict[tuple[str, int], int] = {}
        for topic in (t_plans, t_answers):
            ends = end_offsets(settings, topic)
            if topic == t_answers:
                self.deliver([("partitions", len(ends))])
                ends = {p: offsets for p, offsets in ends.items() if self.share.holds(p)}
                if not self.share.whole:
                    log.info("gateway: replica %d of %d holds answers partitions %s", self.share.index,
                             self.share.count, sorted(ends))
            for partition, (low, high) in ends.items():
                targets[(topic, partition)], starts[(topic, partition)] = high, low
        truncated = sorted(p for (topic, p), low in starts.items() if topic == t_answers and low > 0)
        seeded_below: dict[int, int] = {}  # answers partition -> offset below which answers are in the seed
        if truncated:
            seed, seeded_below = current_seed(settings, truncated)
            self.deliver([("seed", seed)])
            log.info("gateway: answers partitions %s start past offset 0 (retention): current answers of %d "
                     "registrations seeded from answers.current", truncated, len(seed))
        fetcher = Fetcher(settings, "gateway", 5000)
        fetcher.set_positions(starts)  # (where each log starts now: answers may have been cut by retention)
        try:
            while not self.stopping:
                msgs = fetcher.poll()
                batch: Batch = []
                for msg in msgs:
                    if msg.error() is not None:
                        if msg.error().code() != KafkaError._PARTITION_EOF:
                            log.warning("gateway: consume error: %s", msg.error())
                        continue
                    self.records += 1
                    try:
                        if msg.topic() == t_plans:
                            key = (msg.key() or b"").decode()
                            batch.append(("plan", (key, None if msg.value() is None
                                                   else codec.decode("QueryPlan", msg.value()))))
                        elif msg.value() is not None:
                            answer = decode_answer(msg.value())
                            answer.folded = msg.offset() >= seeded_below.get(msg.partition(), 0)
                            batch.append(("answer", answer))
                    except (codec.CodecError, UnicodeDecodeError) as exc:
                        self.undecodable += 1
                        log.warning("gateway: undecodable record at %s[%d]@%d: %s", msg.topic(), msg.partition(),
                                    msg.offset(), exc)
                if batch:
                    self.deliver(batch)
                if not self.ready.is_set() and all(fetcher.positions.get(k, 0) >= high for k, high in targets.items()):
                    self.deliver([("ready", None)])
                    self.ready.set()
        except Exception:  # noqa: BLE001 - logged; the gateway reports not ready and its probe restarts it
            log.exception("gateway: the topic reader failed")
            self.ready.clear()
            self.failed = True
        finally:
            fetcher.close()

    failed = False


def current_seed(settings: KafkaSettings, partitions: list[int]
                 ) -> tuple[dict[tuple[str, int], list[tuple[dict[str, Any], int]]], dict[int, int]]:
    """The current answers of the queries on ``partitions`` from answers.current, per (query, version), and the
    answers offsets they reflect (a consistent cut: ``services.client.reading.current_at_cut``)."""
    from services.client.reading import current_at_cut

    records, ends = current_at_cut(settings, set(partitions), who="gateway", on_error=lambda exc: log.warning(
        "gateway: undecodable answers.current record: %s", exc))
    seed: dict[tuple[str, int], list[tuple[dict[str, Any], int]]] = {}
    for record in records:
        if record["multiplicity"] > 0:
            binding = {v: sparql_json_term(t) for v, t in record["binding"].items()}
            seed.setdefault((record["query_id"], record["version"]), []).append((binding, record["multiplicity"]))
    return seed, {p: high for p, (_low, high) in ends.items()}


class Publisher:
    """``POST /update`` and the admin commands: one idempotent producer, acknowledged writes."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.producer = make_producer(settings)
        self.lock = threading.Lock()

    def publish(self, payload: bytes, fmt: str, source: str = "gateway", timeout: float = 10.0) -> None:
        """Write one record to updates.raw and wait for the broker's acknowledgement (raises on failure)."""
        from services.kafka.client import produce_sync

        headers = [("cbgp-format", fmt.encode()), ("cbgp-source", source.encode()), ("cbgp-first-line", b"1")]
        with self.lock:
            produce_sync(self.producer, self.settings.topic("updates.raw"), payload, headers=headers, partition=0,
                         timeout=timeout)

    def admin(self, command: dict[str, Any], wait: float = 30.0) -> dict[str, Any]:
        from services.client.requests import admin_request

        return admin_request(self.settings, command, wait)

    def close(self) -> None:
        self.producer.flush(5)


class GraphSource:
    """The current graph (see the module docstring); :meth:`query` is thread-safe (one query at a time)."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.lock = threading.Lock()
        self.store = None
        self.dictionary = TermDictionary(stable=True)
        self.positions: dict[tuple[str, int], int] = {}
        self.partitions: dict[str, list[int]] = {}
        self.consumer: Consumer | None = None
        self.seq = 0
        self.quads = 0
        self._terms: dict[int, Any] = {}

    def _term(self, term_id: int) -> Any:
        found = self._terms.get(term_id)
        if found is None:
            found = self._terms[term_id] = to_oxigraph(self.dictionary.decode(term_id))
        return found

    def _quad(self, s: int, p: int, o: int, g: int) -> Any:
        import pyoxigraph as ox

        graph = ox.DefaultGraph() if g == DEFAULT_GRAPH_ID else self._term(g)
        return ox.Quad(self._term(s), self._term(p), self._term(o), graph)

    def _drain(self, topic: str) -> list[Any]:
        """The records of every partition of ``topic`` from where the last call stopped to the end (partition-EOF:
        for this read_committed consumer, the last committed record), with one long-lived assign-only consumer."""
        if self.consumer is None:
            self.consumer = Consumer(self.settings.consumer_config(f"{self.settings.topic_prefix}gateway-graph",
                                                                   enable_partition_eof=True, fetch_wait_max_ms=20))
        if topic not in self.partitions:
            meta = self.consumer.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or meta.error is not None:
                raise KafkaException(meta.error if meta else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, topic))
            self.partitions[topic] = sorted(meta.partitions)
        pending = {(topic, p) for p in self.partitions[topic]}
        self.consumer.assign([TopicPartition(topic, p, self.positions.get((topic, p), OFFSET_BEGINNING))
                              for p in self.partitions[topic]])
        out = []
        deadline = time.monotonic() + 120
        try:
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic} for /query: partitions {sorted(pending)} not at their end")
                # what is fetched already, else the first record or EOF event to arrive (consume(n, t) would wait
                # the whole timeout for n records)
                for msg in self.consumer.consume(2000, 0) or self.consumer.consume(1, 0.2):
                    key = (msg.topic(), msg.partition())
                    err = msg.error()
                    if err is None:
                        out.append(msg)
                        self.positions[key] = msg.offset() + 1
                    elif err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(key)
                        self.positions[key] = max(self.positions.get(key, 0), msg.offset())
                    else:
                        raise KafkaException(err)
        finally:
            self.consumer.unassign()
        return out

    def sync(self) -> int:
        """Read what ``updates.encoded`` and ``dictionary`` gained since the last call and apply it; returns the seq
        the store is at.  updates.encoded is read first: the dictionary entries its changes use were committed in
        the same ingest transactions, so reading the dictionary to its end afterwards covers them."""
        import pyoxigraph as ox

        t_encoded = self.settings.topic("updates.encoded")
        if self.store is not None and self.positions.get((t_encoded, 0), 0) < self._log_start(t_encoded):
            # Deleted below where the graph stands (retention up to `cbgp topics floor`): seeded again, as at start.
            log.info("gateway: updates.encoded was deleted below the /query graph's position: seeding it again")
            self.store, self.seq, self.quads = None, 0, 0
            self.positions.clear()
        if self.store is None:
            self.store = ox.Store()
            self._seed()
        changes = []
        for msg in self._drain(t_encoded):
            if msg.value() is not None:
                changes.extend(codec.encoded_changes(msg.value()))
        for msg in self._drain(self.settings.topic("dictionary")):
            if msg.value() is not None:
                for term_id, term in codec.dictionary_entries(msg.value()):
                    self._add_term(term_id, term)
        for seq, diff, s, p, o, g, _t, _role, refresh in changes:
            self.seq = max(self.seq, seq)
            if refresh:
                continue
            quad = self._quad(s, p, o, g)
            if diff > 0:
                self.store.add(quad)
                self.quads += 1
            else:
                self.store.remove(quad)
                self.quads -= 1
        return self.seq

    def _log_start(self, topic: str) -> int:
        if self.consumer is None:
            return 0  # (nothing read yet)
        return self.consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0]

    def _seed(self) -> None:
        """Start from ingest's last snapshot in Kafka (``checkpoints.ingest``: its presence set, terms and the log
        positions they reflect), so the first query reads only the logs after it, not their whole history (nor
        records retention may have deleted below it).  Without one that serves these logs (ingest with its state
        on disk or checkpoints off, another ``CBGP_CHECKPOINT_SECRET``), the logs are read from offset 0."""
        from services.runtime import recovery

        started = time.monotonic()
        loaded, why = recovery.ingest_snapshot(self.settings, "gateway", ("updates.encoded", "dictionary"))
        if loaded is None:
            log.info("gateway: %s: /query reads the logs from offset 0", why)
            return
        checkpoint, present, terms = loaded
        for term_id, term in terms:
            self.dictionary.add(term_id, term)
        self.store.bulk_extend(self._quad(*quad) for quad in present)
        self.quads, self.seq = len(present), int(checkpoint.facts["seq"])
        self.positions.update({(topic, partition): offset for topic, parts in checkpoint.positions.items()
                               for partition, offset in parts.items()})
        log.info("gateway: /query graph seeded from ingest's snapshot: %d triples, %d terms, seq %d, in %.2f s",
                 self.quads, len(terms), self.seq, time.monotonic() - started)

    def _add_term(self, term_id: int, term: str) -> None:
        if term_id not in self._terms:
            try:
                self.dictionary.add(term_id, term)
            except Exception:  # noqa: BLE001 - a repeated entry
                pass

    def close(self) -> None:
        with self.lock:
            if self.consumer is not None:
                self.consumer.close()
                self.consumer = None

    def query(self, sparql: str) -> tuple[Any, int]:
        """``(pyoxigraph result, seq)`` of ``sparql`` over the graph as of seq; raises SyntaxError / ValueError."""
        with self.lock:
            seq = self.sync()
            return self.store.query(sparql, use_default_graph_as_union=False), seq

    def forked(self, fn: Callable[[Any, int], Any]) -> ForkedJob:
        """``fn(store, seq)`` run in a child process forked with the graph as of seq (under the lock: no change is
        half applied in the child's copy, which must not take the lock)."""
        with self.lock:
            seq = self.sync()
            store = self.store
            return ForkedJob(lambda: fn(store, seq), close_fds=True)  # (the clients' sockets stay the gateway's)


class FleetSampler(threading.Thread):
    """Every ``every`` seconds while someone asks (``GET /fleet`` in the last ``keep`` seconds): end offsets and
    ingest's committed offsets -> rates, lag, idle/busy (:meth:`current`).  Nobody asking, it samples nothing and
    holds no client: the console polls ``/fleet`` while it is open, and nothing else reads it."""

    TOPICS = ("updates.raw", "updates.encoded", "answers")

    def __init__(self, settings: KafkaSettings, every: float = 2.0, keep: float = 30.0) -> None:
        super().__init__(name="gateway-fleet", daemon=True)
        self.settings, self.every, self.keep = settings, every, max(keep, 2 * every)
        self.stopping = False
        self.state: dict[str, Any] = {"state": "unknown", "rates": {}, "lag": {}, "ends": {}, "at_ms": 0}
        self.samples = 0  # taken so far
        self._prev: tuple[float, dict[str, int]] | None = None
        self._asked = -float("inf")  # monotonic time of the last request
        self._sampled = -float("inf")  # ... and of the last sample's end
        self._cond = threading.Condition()
        self._ends_reader: Consumer | None = None  # (kept while sampling: no connection per sample)
        self._ingest_group: Consumer | None = None

    def current(self, wait: float = 2.0) -> dict[str, Any]:
        """The latest sample, and sampling kept on for ``keep`` seconds more.  After a quiet spell (no sample
        for two periods) it waits up to ``wait`` seconds for a fresh one."""
        with self._cond:
            self._asked = time.monotonic()
            if self._asked - self._sampled > 2 * self.every:
                self._cond.notify_all()
                asked = self._asked
                self._cond.wait_for(lambda: self._sampled >= asked or self.stopping, timeout=wait)
            return self.state

    def stop(self) -> None:
        with self._cond:
            self.stopping = True
            self._cond.notify_all()

    def _ends(self) -> dict[str, dict[int, int]]:
        if self._ends_reader is None:
            self._ends_reader = Consumer(self.settings.consumer_config("cbgp-gateway-watermarks"))
        consumer, out = self._ends_reader, {}
        for name in self.TOPICS:
            topic = self.settings.topic(name)
            meta = consumer.list_topics(topic, timeout=5).topics.get(topic)
            parts = sorted(meta.partitions) if meta is not None and meta.error is None else []
            out[name] = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in parts}
        return out

    def _lag(self, topic: str, ends: dict[int, int]) -> int | None:
        """Ingest's records of ``topic`` not taken yet (its group's committed offsets against ``ends``)."""
        if self._ingest_group is None:
            self._ingest_group = Consumer(self.settings.consumer_config(f"{self.settings.topic_prefix}ingest"))
        committed = self._ingest_group.committed([TopicPartition(self.settings.topic(topic), p) for p in ends],
                                                 timeout=5)
        if all(tp.offset < 0 for tp in committed):
            return None  # the group never committed (not running yet)
        return sum(max(0, ends[tp.partition] - max(tp.offset, 0)) for tp in committed)

    def _close_clients(self) -> None:
        for client in (self._ends_reader, self._ingest_group):
            if client is not None:
                client.close()
        self._ends_reader = self._ingest_group = None

    def sample(self) -> dict[str, Any]:
        ends = self._ends()
        totals = {name: sum(v.values()) for name, v in ends.items()}
        now = time.monotonic()
        rates = {}
        if self._prev is not None:  # (after a quiet spell: the mean rate since the last sample)
            then, before = self._prev
            rates = {name: round((totals[name] - before.get(name, 0)) / max(now - then, 1e-6), 2)
                     for name in self.TOPICS}
        self._prev = (now, totals)
        # Ingest's lag only: its input (updates.raw) is not transactional, so end - committed counts records
        # not yet taken.  Groups reading transactional topics (answers on deltas.parts) commit past their
        # records but not past the markers and Frontier marks that follow while idle, so end - committed
        # stays above 0 on an idle fleet: not a backlog, and not shown as one.
        lag = {"ingest": self._lag("updates.raw", ends["updates.raw"])}
        busy = any(r > 0 for r in rates.values()) or any(v for v in lag.values())
        self.state = {"state": "busy" if busy else "idle", "rates": rates, "lag": lag,
                      "ends": {name: totals[name] for name in self.TOPICS}, "at_ms": int(time.time() * 1000)}
        return self.state

    def run(self) -> None:
        while True:
            with self._cond:
                if not self.stopping and time.monotonic() - self._asked > self.keep:
                    self._close_clients()  # (nobody asks: no client kept either)
                    self._cond.wait_for(lambda: self.stopping or time.monotonic() - self._asked <= self.keep)
                if self.stopping:
                    break
            try:
                self.sample()
            except Exception as exc:  # noqa: BLE001 - the broker is away: reported as such, fresh clients next
                self._close_clients()
                self.state = {**self.state, "state": "unknown", "error": str(exc)}
            with self._cond:
                self.samples += 1
                self._sampled = time.monotonic()
                self._cond.notify_all()
                self._cond.wait(self.every)
        self._close_clients()
