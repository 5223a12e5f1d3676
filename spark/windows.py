"""Event-time windows with expiry, as a Structured Streaming query.

A windowed query (RSP-QL ``FROM NAMED WINDOW`` clause or ``window=...`` register options) is evaluated here
alone; the state workers skip it.  Semantics (what counts as in the window at an instant, reports at
instants of the step grid, late data): ``cbgp.windows``.

    updates.encoded --fan out to windowed queries--> groupBy(query_id).applyInPandasWithState
                    --> deltas.parts (part -1, numbered by the answers service)

Fan-out: every record of ``updates.encoded`` (one partition: the total order) becomes a row per windowed
query whose predicates it can match, plus one *tick* row per query and input chunk carrying the chunk's
highest event time and seq, so every query's watermark advances with the stream even when none of its
triples arrive.  Stream time is the event time of the data (Kafka Streams' rule): with no input at all
the watermark stays where it is.

A windowed query sees the updates this job reads after it learned of the query (it reads the plans topic
at every chunk); a query registered while data is flowing starts with an empty window.

Idempotence (``services.idempotence``): an output's key is ``(source_partition = WINDOW_SOURCE_PARTITION = -2,
source_offset = instant (ms), index)``: instants only grow, and a re-run batch starts from the same state
version, so it reproduces the same keys, which the answers service drops.
"""

from __future__ import annotations

import pickle
from typing import Any, Iterator, Mapping

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from cbgp.sparql import parse_query
from cbgp.terms import stable_term_id
from cbgp.windows import WindowedQuery
from services import codec
from services.idempotence import WINDOW_SOURCE_PARTITION
from services.records import query_partition

__all__ = ["WINDOW_SOURCE_PARTITION", "fan_out", "start_windows", "window_group"]

# (kafka_offset, item) is a change's stream position: item = its place in the offset's batch record.
UPDATE_SCHEMA = ("query_id string, tick boolean, kafka_offset long, item int, seq long, op int, s long, p long, "
                 "o long, g long, event_time_ms long")
OUTPUT_SCHEMA = "key binary, value binary, partition int"
STATE_SCHEMA = "blob binary"

_LIVE: dict[str, tuple[int, WindowedQuery]] = {}  # query id -> (state version, evaluator), per Python worker
_PREDICATES: dict[tuple[str, int], frozenset[int]] = {}  # (query id, version) -> predicate ids


def _predicates(query_id: str, version: int, sparql: str) -> frozenset[int]:
    """Predicate ids the query's patterns use (predicates are always constants: the parser rejects
    variables there)."""
    key = (query_id, version)
    if key not in _PREDICATES:
        _PREDICATES[key] = frozenset(stable_term_id(t.p) for t in parse_query(sparql).patterns)
    return _PREDICATES[key]


def fan_out(kafka_config: Mapping[str, Any], plans_topic: str):  # noqa: ANN201
    """mapInPandas function: encoded updates -> one row per (windowed query, relevant update) + ticks."""
    columns = [c.split()[0] for c in UPDATE_SCHEMA.split(", ")]

    def expand(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from spark.plans import plan_cache

        for batch in batches:
            windowed = [p for p in plan_cache(kafka_config, plans_topic).refresh().values() if p.window is not None]
            if batch.empty or not windowed:
                continue
            decoded = []
            for value, offset in zip(batch["value"], batch["offset"]):
                try:
                    changes = codec.encoded_changes(bytes(value))
                except codec.CodecError:
                    continue  # the workers dead-letter undecodable records
                for item, (seq, sign, s, p, o, g, event_time, _refresh) in enumerate(changes):
                    if event_time is None:
                        continue  # ingest always sets one; records from before it did have no place in a window
                    decoded.append((int(offset), item, seq, sign, s, p, o, g, event_time))
            if not decoded:
                continue
            last_offset = max(d[0] for d in decoded)
            top_seq = max(d[2] for d in decoded)
            top_time = max(d[8] for d in decoded)
            rows = []
            for plan in windowed:
                wanted = _predicates(plan.query_id, plan.version, plan.sparql)
                rows.extend((plan.query_id, False, *d) for d in decoded if d[5] in wanted)
                rows.append((plan.query_id, True, last_offset, 0, top_seq, 0, 0, 0, 0, 0, top_time))
            yield pd.DataFrame(rows, columns=columns)

    return expand


def window_group(query_id: str, updates: pd.DataFrame, evaluator: WindowedQuery, top_seq: int,
                 top_time: int | None, deltas_partitions: int) -> tuple[int, int | None, int, list[tuple]]:
    """Feed one query's rows (updates and ticks, any order) to its evaluator in stream order, advance its
    watermark; return (top seq, top event time, late updates dropped, output records)."""
    out: list[tuple[bytes, bytes, int]] = []
    dropped = 0
    updates = updates.sort_values(["kafka_offset", "tick", "item"], kind="stable")
    for tick, seq, op, s, p, o, g, event_time in zip(updates["tick"], updates["seq"], updates["op"], updates["s"],
                                                     updates["p"], updates["o"], updates["g"],
                                                     updates["event_time_ms"]):
        top_seq = max(top_seq, int(seq))
        top_time = int(event_time) if top_time is None else max(top_time, int(event_time))
        if not tick and not evaluator.add(int(op), int(s), int(p), int(o), int(g), int(event_time)):
            dropped += 1
    if top_time is None:
        return top_seq, top_time, dropped, out
    target = query_partition(query_id, deltas_partitions)
    key = query_id.encode()
    for report in evaluator.advance(top_time - evaluator.spec.lateness_ms):
        for index, (sign, row) in enumerate(report.deltas):
            record = {"query_id": query_id, "part": -1, "seq": top_seq, "sign": "PLUS" if sign > 0 else "MINUS",
                      "binding": dict(zip(evaluator.columns, row)), "source_partition": WINDOW_SOURCE_PARTITION,
                      "source_offset": report.instant_ms, "index": index, "snapshot": False,
                      "event_time_ms": report.instant_ms}
            out.append((key, codec.encode("PartDelta", record), target))
    return top_seq, top_time, dropped, out


def _state_function(kafka_config: Mapping[str, Any], plans_topic: str, deltas_partitions: int):  # noqa: ANN202
    def evaluate(key: tuple, batches: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        from spark.plans import plan_cache

        query_id = key[0]
        updates = pd.concat(list(batches), ignore_index=True)
        plan = plan_cache(kafka_config, plans_topic).get(query_id)
        saved = pickle.loads(state.get[0]) if state.exists else None
        if plan is None or plan.window is None or (saved and saved["plan_version"] != plan.version):
            # unregistered, or re-registered: the old window's state is garbage
            state.remove()
            _LIVE.pop(query_id, None)
            if plan is None or plan.window is None:
                yield pd.DataFrame([], columns=["key", "value", "partition"])
                return
            saved = None
        version = saved["version"] if saved else 0
        live = _LIVE.get(query_id)
        if saved is None:
            evaluator = WindowedQuery(plan.sparql, plan.window)
        elif live is not None and live[0] == version:
            evaluator = live[1]  # this process ran the previous batch: skip rebuilding it
        else:
            evaluator = WindowedQuery.from_state(plan.sparql, plan.window, saved["window"])
        top_seq, top_time, dropped, out = window_group(
            query_id, updates, evaluator, saved["top_seq"] if saved else 0, saved["top_time"] if saved else None,
            deltas_partitions)
        version += 1
        state.update((pickle.dumps({"version": version, "plan_version": plan.version, "top_seq": top_seq,
                                    "top_time": top_time, "late_dropped": (saved or {}).get("late_dropped", 0) + dropped,
                                    "window": evaluator.to_state()}),))
        _LIVE[query_id] = (version, evaluator)
        yield pd.DataFrame(out, columns=["key", "value", "partition"])

    return evaluate


def start_windows(spark: SparkSession, kafka_options: Mapping[str, str], topics: Mapping[str, str],
                  deltas_partitions: int, checkpoint_dir: str, interval_s: float | None,
                  kafka_config: Mapping[str, Any], commit_group: str) -> StreamingQuery:
    """Start the window query (``interval_s=None``: availableNow, one pass, for tests and cron)."""
    source: DataFrame = (spark.readStream.format("cbgpkafka").options(**kafka_options)
                         .option("subscribe", topics["updates.encoded"]).option("commitGroup", commit_group).load())
    rows = source.select("value", "offset").mapInPandas(fan_out(dict(kafka_config), topics["queries.plans"]),
                                                         UPDATE_SCHEMA)
    reports = rows.groupBy("query_id").applyInPandasWithState(
        _state_function(dict(kafka_config), topics["queries.plans"], deltas_partitions),
        OUTPUT_SCHEMA, STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout)
    writer = (reports.writeStream.queryName("cbgp-windows").format("cbgpkafka").options(**kafka_options)
              .option("topic", topics["deltas.parts"]).option("checkpointLocation", checkpoint_dir))
    writer = writer.trigger(availableNow=True) if interval_s is None else \
        writer.trigger(processingTime=f"{interval_s} seconds")
    return writer.start()
