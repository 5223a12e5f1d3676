"""Cartesian-product assembly of multi-part queries, as a Structured Streaming query.

The state workers publish, for a query with several parts (ground part, stars, components), each part's
match deltas on ``deltas.parts`` (``part`` = 0, 1, ...; see ``services.worker_core``).  This job keeps every
part's current matches in Spark's state store, keyed by query id, and multiplies them with the delta rule
(``cbgp.assembly.Assembler``):

    deltas.parts (part >= 0) --decode--> groupBy(query_id).applyInPandasWithState --> deltas.parts (part -1)

and the answers service numbers the ``part = -1`` records like any worker's.  Exactness: one worker owns
a query and writes all part deltas of one update in one Kafka transaction, and the source reads committed
data only, so a micro-batch never holds half of an update; within a batch the records are applied in
offset order, one update (seq) at a time, and each update's answer deltas are consolidated, so the output
is exact per update, not just at batch boundaries.

Idempotence (``services.idempotence``): an output's key is ``(source_partition = -100 - input partition,
source_offset = offset of the update's last part delta, index)``.  A re-run batch (after a crash) starts from
the same state version and reads the same records, so it produces the same keys, which the answers service
drops.

State per query is pickled into one binary column (``applyInPandasWithState`` keeps a row per key); each
Python worker also caches the live :class:`Assembler` so a batch does not unpickle it again unless Spark
restored an older state version (restart, retried batch).
"""

from __future__ import annotations

import json
import pickle
from typing import Any, Iterator, Mapping

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.state import GroupState, GroupStateTimeout

from cbgp.assembly import Assembler, split_parts
from services import codec
from services.idempotence import ASSEMBLY_SOURCE_BASE, assembly_source_partition
from services.records import WHOLE_QUERY_PART, query_partition

__all__ = ["ASSEMBLY_SOURCE_BASE", "assemble_group", "decode_part_deltas", "start_assembly"]

PART_DELTA_SCHEMA = ("query_id string, part int, seq long, sign int, binding string, snapshot boolean, "
                     "kafka_partition int, kafka_offset long")
OUTPUT_SCHEMA = "key binary, value binary, partition int"
STATE_SCHEMA = "blob binary"

_LIVE: dict[str, tuple[int, str, Assembler]] = {}  # query id -> (state version, sparql, assembler)


def decode_part_deltas(kafka_df: DataFrame) -> DataFrame:
    """The part deltas (part >= 0) of a cbgpkafka DataFrame of ``deltas.parts``; undecodable records are
    the answers service's to dead-letter, so they are skipped here, and so are the workers' PartDeltaBatch
    records (answers, part -1, which ``decode("PartDelta")`` refuses)."""

    def decode(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            rows = []
            for value, partition, offset in zip(batch["value"], batch["partition"], batch["offset"]):
                try:
                    record = codec.decode("PartDelta", bytes(value))
                except codec.CodecError:
                    continue
                if record["part"] < 0:
                    continue
                rows.append((record["query_id"], record["part"], record["seq"],
                             1 if record["sign"] == "PLUS" else -1, json.dumps(record["binding"]),
                             record["snapshot"], int(partition), int(offset)))
            yield pd.DataFrame(rows, columns=[c.split()[0] for c in PART_DELTA_SCHEMA.split(", ")])

    return kafka_df.select("value", "partition", "offset").mapInPandas(decode, PART_DELTA_SCHEMA)


def assemble_group(query_id: str, deltas: pd.DataFrame, assembler: Assembler | None, sparql: str | None,
                   deltas_partitions: int) -> tuple[Assembler | None, list[tuple[bytes, bytes, int]]]:
    """Apply one query's part deltas (in offset order) to ``assembler``; return it and the output records.

    ``sparql`` is the query's current plan text (None: unregistered, so the deltas are dropped).  A run of
    snapshot deltas (a new registration or version) starts from empty parts.
    """
    out: list[tuple[bytes, bytes, int]] = []
    if sparql is None:
        return None, out
    target = query_partition(query_id, deltas_partitions)
    key = query_id.encode()
    deltas = deltas.sort_values("kafka_offset", kind="stable")
    part_columns = [part.columns for part in split_parts(sparql)]
    previous: tuple[int, bool] | None = None
    group: list[tuple[int, int, tuple[int, ...]]] = []
    last_offset, last_partition = -1, 0

    def flush() -> None:
        nonlocal assembler
        if previous is None:
            return
        seq, snapshot = previous
        if snapshot or assembler is None:
            assembler = Assembler(sparql)
        for index, (sign, row) in enumerate(assembler.apply(group)):
            record = {"query_id": query_id, "part": WHOLE_QUERY_PART, "seq": seq, "sign": "PLUS" if sign > 0 else "MINUS",
                      "binding": dict(zip(assembler.columns, row)),
                      "source_partition": assembly_source_partition(last_partition), "source_offset": last_offset,
                      "index": index, "snapshot": snapshot, "event_time_ms": None}
            out.append((key, codec.encode("PartDelta", record), target))

    for part, seq, sign, binding, snapshot, partition, offset in zip(
            deltas["part"], deltas["seq"], deltas["sign"], deltas["binding"], deltas["snapshot"],
            deltas["kafka_partition"], deltas["kafka_offset"]):
        current = (int(seq), bool(snapshot))
        if current != previous:
            flush()
            previous, group = current, []
        values = json.loads(binding)
        group.append((int(part), int(sign), tuple(values[c] for c in part_columns[int(part)])))
        last_offset, last_partition = int(offset), int(partition)
    flush()
    return assembler, out


def _state_function(kafka_config: Mapping[str, Any], plans_topic: str, deltas_partitions: int):  # noqa: ANN202
    def assemble(key: tuple, batches: Iterator[pd.DataFrame], state: GroupState) -> Iterator[pd.DataFrame]:
        from spark.plans import plan_cache

        query_id = key[0]
        deltas = pd.concat(list(batches), ignore_index=True)
        version, sparql, assembler = 0, None, None
        if state.exists:
            saved = pickle.loads(state.get[0])
            version, sparql = saved["version"], saved["sparql"]
            live = _LIVE.get(query_id)
            if live is not None and live[0] == version and live[1] == sparql:
                assembler = live[2]  # this process ran the previous batch: skip the unpickling
            else:
                assembler = Assembler.from_state(sparql, saved["assembler"])
        # Refresh every time: this process may have cached the plan before an unregistration, and a stale
        # cache would keep answering a query nobody asks any more (one watermark look per partition).
        plan = plan_cache(kafka_config, plans_topic).refresh().get(query_id)
        if plan is None:  # unregistered: drop its deltas and state
            sparql = None
        elif deltas["snapshot"].any() or sparql is None:  # a (re-)registration: take its current text
            sparql = plan.sparql
        assembler, out = assemble_group(query_id, deltas, assembler, sparql, deltas_partitions)
        if assembler is None:
            state.remove()
            _LIVE.pop(query_id, None)
        else:
            version += 1
            state.update((pickle.dumps({"version": version, "sparql": sparql, "assembler": assembler.to_state()}),))
            _LIVE[query_id] = (version, sparql, assembler)
        yield pd.DataFrame(out, columns=["key", "value", "partition"])

    return assemble


def start_assembly(spark: SparkSession, kafka_options: Mapping[str, str], topics: Mapping[str, str],
                   deltas_partitions: int, checkpoint_dir: str, interval_s: float | None,
                   kafka_config: Mapping[str, Any], commit_group: str) -> StreamingQuery:
    """Start the assembly query (``interval_s=None``: availableNow, one pass, for tests and cron)."""
    source = (spark.readStream.format("cbgpkafka").options(**kafka_options)
              .option("subscribe", topics["deltas.parts"]).option("commitGroup", commit_group).load())
    assembled = (decode_part_deltas(source).groupBy("query_id").applyInPandasWithState(
        _state_function(dict(kafka_config), topics["queries.plans"], deltas_partitions),
        OUTPUT_SCHEMA, STATE_SCHEMA, "append", GroupStateTimeout.NoTimeout))
    writer = (assembled.writeStream.queryName("cbgp-assembly").format("cbgpkafka").options(**kafka_options)
              .option("topic", topics["deltas.parts"]).option("checkpointLocation", checkpoint_dir))
    writer = writer.trigger(availableNow=True) if interval_s is None else \
        writer.trigger(processingTime=f"{interval_s} seconds")
    return writer.start()
