"""Event-time windows with expiry, as a Structured Streaming query.

How it works: docs/design/internals.md, spark.window_stream.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from cbgp.query.sparql import ParsedQuery
from cbgp.terms import DEFAULT_GRAPH_ID
from cbgp.windows.windowed import WindowedQuery, WindowReport
from services import codec
from services.wire.idempotence import WINDOW_SOURCE_PARTITION
from services.wire.records import query_partition
from services.worker.shard_engine import ASK_FALSE, ASK_TRUE, ASK_VARIABLE, ask_flip
from spark import state_log
from spark.dictionary import FleetTerms, fleet_terms

__all__ = ["GC_DELAY_MS", "WINDOW_SOURCE_PARTITION", "WindowProcessor", "fan_out", "start_windows", "window_group"]

# One row per (windowed query, input chunk): the chunk's relevant changes as one int64 matrix (``updates``,
# columns ``_CHANGE_COLUMNS``, in stream order), plus the chunk's stream position and time (the tick: it moves
# the query's watermark even when none of its triples came).  A few rows per batch instead of one per change:
# the shuffle and the Arrow transfer to the stateful operator carry columns, not per-change rows.
UPDATE_SCHEMA = ("query_id string, first_offset long, last_offset long, top_seq long, top_time long, "
                 "updates binary, wm_ms long")
_UPDATE_COLUMNS = [c.split()[0] for c in UPDATE_SCHEMA.split(", ")]
_CHANGE_COLUMNS = ("kafka_offset", "item", "seq", "op", "s", "p", "o", "g", "t")
OUTPUT_SCHEMA = "key binary, value binary, topic string, partition int"  # topic: null for deltas.parts
META_SCHEMA = ("version long, plan_version int, top_seq long, top_time long, late_dropped long, timer long, "
               "tail_inputs long")
GC_DELAY_MS = 10 * 60 * 1000  # watermark delay: how far behind the newest chunk a chunk may still come
SENTINEL = ""  # the per-chunk row that moves the watermark when no windowed query is registered
MAX_BATCH_DELTAS = 2000  # answer deltas per PartDeltaColumns record
MIN_TAIL = 20_000  # inputs replayed at most before the base is rewritten (see spark.state_log)
TAIL_FACTOR = 4  # ... and at most 4x the window's entries (see spark.state_log)
TASKS_CONF = "spark.cbgp.windows.tasks"  # Spark conf: tasks (state partitions) the windowed queries run in

_LIVE: state_log.LiveCache[WindowedQuery] = state_log.LiveCache()  # per Python worker


class PredicateCache:
    """Per windowed query, the predicate ids its patterns read (None: any, a variable predicate of an operator
    query), for its current registration version; only the queries registered now are kept."""

    def __init__(self) -> None:
        self._ids: dict[str, tuple[int, np.ndarray | None]] = {}  # query id -> (version, predicate ids)

    def __len__(self) -> int:
        return len(self._ids)

    def get(self, query_id: str, version: int, sparql: str, window: Any) -> np.ndarray | None:
        found = self._ids.get(query_id)
        if found is None or found[0] != version:
            read = WindowedQuery(sparql, window).predicates  # (stable ids, as ingest's)
            found = self._ids[query_id] = (version, None if read is None else np.array(sorted(read), dtype=np.int64))
        return found[1]

    def keep(self, query_ids: set[str]) -> None:
        """Forget the queries not in ``query_ids`` (unregistered, or no longer windowed)."""
        for query_id in self._ids.keys() - query_ids:
            del self._ids[query_id]


_PREDICATES = PredicateCache()  # per Python worker


def _analyse(text: str) -> Any:
    from cbgp.algebra import analyse  # (rdflib: loaded by the Python workers that evaluate windows)

    return analyse(text)


def _decode_chunk(values: Any, offsets: Any) -> dict[str, np.ndarray] | None:
    """The changes of a chunk of updates.encoded records, column by column (records without event time and
    undecodable ones left out: the workers dead-letter the latter)."""
    cols: dict[str, list] = {k: [] for k in ("kafka_offset", "item", "seq", "op", "s", "p", "o", "g", "t")}
    for value, offset in zip(values, offsets):
        data = bytes(value)
        try:
            columns = codec.encoded_columns(data)
            if columns is not None:
                n = len(columns[0])
            else:
                changes = codec.encoded_changes(data)
                n = len(changes)
                columns = tuple(zip(*[change[:7] for change in changes]))  # (seq, diff, s, p, o, g, event time)
        except codec.CodecError:
            continue
        cols["kafka_offset"].append(np.full(n, int(offset), dtype=np.int64))
        cols["item"].append(np.arange(n, dtype=np.int32))
        for name, column in zip(("seq", "op", "s", "p", "o", "g", "t"), columns):
            cols[name].append(column)
    if not cols["seq"]:
        return None
    out = {"kafka_offset": np.concatenate(cols["kafka_offset"]), "item": np.concatenate(cols["item"])}
    for name in ("seq", "op", "s", "p", "o", "g"):
        out[name] = np.fromiter((x for part in cols[name] for x in part), dtype=np.int64)
    times = [x for part in cols["t"] for x in part]
    known = np.array([t is not None for t in times], dtype=bool)
    out["t"] = np.array([t if t is not None else 0 for t in times], dtype=np.int64)
    if not known.all():  # ingest always sets one; records from before it did have no place in a window
        out = {k: v[known] for k, v in out.items()}
        if not len(out["seq"]):
            return None
    return out


def fan_out(kafka_config: Mapping[str, Any], plans_topic: str):  # noqa: ANN201
    """mapInPandas function: encoded updates -> one row per (windowed query, chunk) holding the query's
    relevant changes, and the watermark sentinel."""

    def expand(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from spark.plan_topic import plan_cache

        for batch in batches:
            if batch.empty:
                continue
            chunk = _decode_chunk(batch["value"], batch["offset"])
            if chunk is None:
                continue
            windowed = [p for p in plan_cache(kafka_config, plans_topic).refresh().values() if p.window is not None]
            _PREDICATES.keep({plan.query_id for plan in windowed})
            first_offset = int(chunk["kafka_offset"].min())
            last_offset = int(chunk["kafka_offset"].max())
            top_seq = int(chunk["seq"].max())
            top_time = int(chunk["t"].max())
            matrix = np.column_stack([chunk[c].astype(np.int64) for c in _CHANGE_COLUMNS])
            ids, blobs = [SENTINEL], [b""]
            for plan in windowed:
                read = _PREDICATES.get(plan.query_id, plan.version, plan.sparql, plan.window)
                ids.append(plan.query_id)
                blobs.append(np.ascontiguousarray(matrix if read is None else matrix[np.isin(chunk["p"], read)])
                             .tobytes())
            n = len(ids)
            yield pd.DataFrame({"query_id": ids, "first_offset": [first_offset] * n, "last_offset": [last_offset] * n,
                                "top_seq": [top_seq] * n, "top_time": [top_time] * n, "updates": blobs,
                                "wm_ms": [top_time] * n})

    return expand


def _changes(updates: pd.DataFrame) -> np.ndarray:
    """The changes of one query's rows, in stream order: an int64 matrix with columns ``_CHANGE_COLUMNS``."""
    updates = updates.sort_values("first_offset", kind="stable")
    parts = [np.frombuffer(blob, dtype=np.int64).reshape(-1, len(_CHANGE_COLUMNS)) for blob in updates["updates"]
             if blob is not None and len(blob)]
    if not parts:
        return np.zeros((0, len(_CHANGE_COLUMNS)), dtype=np.int64)
    matrix = np.concatenate(parts)
    order = np.lexsort((matrix[:, 1], matrix[:, 0]))  # (offset, item): chunks may overlap after a rerun
    return matrix[order]


def window_group(query_id: str, updates: pd.DataFrame, evaluator: WindowedQuery, top_seq: int,
                 top_time: int | None, deltas_partitions: int) -> tuple[int, int | None, int, list[tuple], Any]:
    """Feed one query's rows (chunks of its changes, any order) to its evaluator in stream order, advance its
    watermark; return (top seq, top event time, late updates dropped, output records, replay record).

    Output records are PartDeltaColumns records of at most ``MAX_BATCH_DELTAS`` deltas; the replay record
    (``(rows, watermark)``) is what :func:`replay` needs to redo this batch on a rebuilt evaluator."""
    if len(updates):
        top_seq = max(top_seq, int(updates["top_seq"].max()))
        batch_top = int(updates["top_time"].max())
        top_time = batch_top if top_time is None else max(top_time, batch_top)
    rows = _changes(updates)[:, [3, 4, 5, 6, 7, 8]] if len(updates) else np.zeros((0, 6), dtype=np.int64)
    dropped = 0
    terms = evaluator.dictionary if isinstance(evaluator.dictionary, FleetTerms) else None
    if terms is not None and len(rows):  # an operator query reads terms: those of these updates, first
        terms.wait_for(set(np.unique(rows[:, [1, 2, 3, 4]]).tolist()) - {DEFAULT_GRAPH_ID})
    add = evaluator.add
    for op, s, p, o, g, event_time in rows.tolist():
        if not add(op, s, p, o, g, event_time):
            dropped += 1
    if top_time is None:
        return top_seq, top_time, dropped, [], (rows, None)
    watermark = top_time - evaluator.spec.lateness_ms
    out: list[tuple[bytes, bytes, str | None, int]] = []
    pending: list[tuple] = []
    target = query_partition(query_id, deltas_partitions)
    key = query_id.encode()
    first = evaluator.last_instant is None
    reports = evaluator.advance(watermark)
    if evaluator.form == "ASK":
        columns: tuple[str, ...] = (ASK_VARIABLE,)
        reports = _ask_reports(evaluator, reports, first)
    else:
        columns = evaluator.columns
    if terms is not None:  # the terms its answers use that the topic lacks (a COUNT...), published with them
        made = sorted({v for report in reports for _diff, row in report.deltas for v in row
                       if v is not None and not terms.published(v)})
        out.extend((str(term_id).encode(), codec.encode("DictionaryEntry", {"id": term_id,
                                                                            "term": terms.decode(term_id)}),
                    terms.topic, term_id % len(terms.partitions)) for term_id in made)

    def flush() -> None:
        if pending:
            out.append((key, codec.encode_part_delta_batch(query_id, -1, columns, pending), None, target))
            pending.clear()

    for report in reports:
        for index, (diff, row) in enumerate(report.deltas):
            pending.append((top_seq, diff, row, WINDOW_SOURCE_PARTITION, report.instant_ms,
                            index, False, report.instant_ms))
            if len(pending) >= MAX_BATCH_DELTAS:
                flush()
    flush()
    evaluator.dictionary.collect()  # (the values its aggregates let go: every answer naming one is written)
    return top_seq, top_time, dropped, out, (rows, watermark)


def _ask_reports(evaluator: WindowedQuery, reports: list[WindowReport], first: bool) -> list[WindowReport]:
    """An ASK's reports as the fleet reports ASK (``?ask`` false from the first instant, then flipped), from
    the algebra's (one empty row while it holds)."""
    encode = evaluator.dictionary.encode
    true, false = (encode(ASK_TRUE),), (encode(ASK_FALSE),)
    out = [WindowReport(report.instant_ms, ask_flip(report.deltas, true, false)) for report in reports]
    if first and evaluator.last_instant is not None:  # its first answer (as an aggregate's 0 comes first)
        if out:  # it came true: "false" was never said
            out[0] = WindowReport(out[0].instant_ms, [(1, true)])
        else:
            out = [WindowReport(evaluator.last_instant, [(1, false)])]
    return out


def replay(evaluator: WindowedQuery, record: Any) -> WindowedQuery:
    """Redo one batch (a :func:`window_group` replay record) on ``evaluator``, discarding its output."""
    rows, watermark = record
    add = evaluator.add
    for op, s, p, o, g, event_time in rows.tolist():
        add(op, s, p, o, g, event_time)
    if watermark is not None:
        evaluator.advance(watermark)
        evaluator.dictionary.collect()
    return evaluator


def _horizon(evaluator: WindowedQuery) -> int:
    spec = evaluator.spec
    return spec.range_ms + spec.lateness_ms + spec.step_ms


_EMPTY = pd.DataFrame({"key": pd.Series([], dtype=object), "value": pd.Series([], dtype=object),
                       "topic": pd.Series([], dtype=object), "partition": pd.Series([], dtype=np.int32)})


class WindowProcessor(state_log.QueryStateProcessor):
    """One windowed query's evaluator in keyed state (see the module docstring)."""

    META_SCHEMA = META_SCHEMA

    def __init__(self, kafka_config: Mapping[str, Any], plans_topic: str, deltas_partitions: int,
                 dictionary_topic: str) -> None:
        super().__init__(kafka_config, plans_topic, deltas_partitions)
        self.dictionary_topic = dictionary_topic

    def _plans(self):  # noqa: ANN202
        from spark.plan_topic import plan_cache

        return plan_cache(self.kafka_config, self.plans_topic)

    def _terms(self, plan: Any) -> FleetTerms | None:
        """The fleet's dictionary for a query with operators (they read terms and make some); None for a BGP."""
        if isinstance(_analyse(plan.sparql), ParsedQuery):
            return None
        return fleet_terms(self.kafka_config, self.dictionary_topic)

    def _forget(self, query_id: str, meta: tuple | None) -> None:
        if meta is not None and meta[5] is not None:
            self.handle.deleteTimer(int(meta[5]))
        state_log.clear_all((self.meta, self.base, self.tail))
        _LIVE.drop(query_id)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        query_id = key[0]
        updates = pd.concat(list(rows), ignore_index=True)
        if query_id == SENTINEL:
            return
        plan = self._plans().get(query_id)
        meta = self.meta.get() if self.meta.exists() else None
        if plan is None or plan.window is None or (meta is not None and meta[1] != plan.version):
            # unregistered, or re-registered: the old window's state is garbage
            self._forget(query_id, meta)
            if plan is None or plan.window is None:
                return
            meta = None
        version, _pv, top_seq, top_time, late_dropped, timer, tail_inputs = meta or (0, plan.version, 0, None, 0,
                                                                                    None, 0)
        token = (plan.version, plan.sparql)

        def build(saved: dict | None) -> WindowedQuery:
            terms = self._terms(plan)
            return WindowedQuery(plan.sparql, plan.window, terms) if saved is None else \
                WindowedQuery.from_state(plan.sparql, plan.window, saved, terms)

        evaluator = _LIVE.evaluator(query_id, version, token, self.base, self.tail, build, replay) \
            if meta is not None else build(None)
        top_seq, top_time, dropped, out, record = window_group(query_id, updates, evaluator, top_seq, top_time,
                                                               self.deltas_partitions)
        inputs = len(record[0])
        tail_inputs = state_log.save(self.base, self.tail, tail_inputs, max(inputs, 1), record, version + 1,
                                     evaluator.state_entries, evaluator.to_state, MIN_TAIL, TAIL_FACTOR)
        if top_time is not None:
            wanted = top_time + _horizon(evaluator)
            if wanted != timer:
                if timer is not None:
                    self.handle.deleteTimer(int(timer))
                self.handle.registerTimer(wanted)
                timer = wanted
        version += 1
        self.meta.update((version, plan.version, top_seq, top_time, late_dropped + dropped, timer, tail_inputs))
        _LIVE.put(query_id, version, token, evaluator)
        if out:
            keys, values, topics, partitions = zip(*out)
            yield pd.DataFrame({"key": list(keys), "value": list(values), "topic": list(topics),
                                "partition": np.array(partitions, dtype=np.int32)})

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        query_id = key[0]
        meta = self.meta.get() if self.meta.exists() else None
        plan = self._plans().refresh().get(query_id)
        if plan is None or plan.window is None or meta is None or meta[1] != plan.version:
            # nothing came for this query for range + lateness + step past the watermark delay: it is gone
            state_log.clear_all((self.meta, self.base, self.tail))
            _LIVE.drop(query_id)
            return
        # still registered (its rows were late or starved): look again later
        spec = plan.window
        wanted = max(timerValues.getCurrentWatermarkInMs(), int(meta[3] or 0)) + spec.range_ms + spec.lateness_ms \
            + spec.step_ms
        self.handle.registerTimer(wanted)
        self.meta.update((*meta[:5], wanted, meta[6]))
        yield from ()  # a generator, as Spark iterates the result: no output on expiry


def start_windows(spark: SparkSession, kafka_options: Mapping[str, str], topics: Mapping[str, str],
                  deltas_partitions: int, checkpoint_dir: str, interval_s: float | None,
                  kafka_config: Mapping[str, Any], commit_group: str) -> StreamingQuery:
    """Start the window query (``interval_s=None``: availableNow, one pass, for tests and cron)."""
    source: DataFrame = (spark.readStream.format("cbgpkafka").options(**kafka_options)
                         .option("subscribe", topics["updates.encoded"]).option("commitGroup", commit_group)
                         .option("onlyWhenNeededBy", "windows").option("plansTopic", topics["queries.plans"])
                         # (one partition, the total order: read and fanned out on every core, the stateful
                         # stage puts each query's changes back in offset order)
                         .option("minPartitions", str(spark.sparkContext.defaultParallelism)).load())
    rows = (source.select("value", "offset").mapInPandas(fan_out(dict(kafka_config), topics["queries.plans"]),
                                                          UPDATE_SCHEMA)
            .withColumn("wm_ts", F.timestamp_millis("wm_ms")).drop("wm_ms")
            .withWatermark("wm_ts", f"{GC_DELAY_MS} milliseconds"))
    # The windowed queries run in TASKS_CONF tasks (default 1).  Spark gives each task to whichever Python
    # worker is idle, so with several tasks per batch the workers trade queries, and a worker that gets one
    # back replays the batches it missed (spark.state_log): on two cores that cost more than the one core it
    # freed.  With one task a single worker keeps every window live.  (The count is fixed by the checkpoint.)
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", spark.conf.get(TASKS_CONF, "1"))
    reports = rows.groupBy("query_id").transformWithStateInPandas(
        WindowProcessor(dict(kafka_config), topics["queries.plans"], deltas_partitions, topics["dictionary"]),
        OUTPUT_SCHEMA, "append", "EventTime")
    writer = (reports.writeStream.queryName("cbgp-windows").format("cbgpkafka").options(**kafka_options)
              .option("topic", topics["deltas.parts"]).option("checkpointLocation", checkpoint_dir))
    writer = writer.trigger(availableNow=True) if interval_s is None else \
        writer.trigger(processingTime=f"{interval_s} seconds")
    try:
        return writer.start()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
