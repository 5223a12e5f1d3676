"""Cartesian-product assembly of multi-part queries, as a Structured Streaming query.

How it works: docs/design/internals.md, spark.assembly_stream.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Mapping

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from cbgp.engine.assembly import Assembler, split_parts
from services import codec
from services.wire.idempotence import assembly_source_partition
from services.wire.records import WHOLE_QUERY_PART, query_partition
from spark import state_log

__all__ = [ "AssemblyProcessor", "assemble_group", "decode_part_deltas", "start_assembly"]

PART_DELTA_SCHEMA = ("query_id string, part int, seq long, sign int, binding string, snapshot boolean, "
                     "kafka_partition int, kafka_offset long")
_PART_DELTA_COLUMNS = [c.split()[0] for c in PART_DELTA_SCHEMA.split(", ")]
OUTPUT_SCHEMA = "key binary, value binary, partition int"
META_SCHEMA = "version long, sparql string, tail_inputs long"
MAX_BATCH_DELTAS = 2000  # answer deltas per PartDeltaColumns record
MIN_TAIL = 20_000  # part deltas replayed at most before the base is rewritten (see spark.state_log)

_LIVE: state_log.LiveCache[Assembler] = state_log.LiveCache()  # per Python worker


def _part_delta_headers() -> list[bytes]:
    """The record headers (magic + schema fingerprint) of every PartDelta writer schema the codec knows."""
    registry = codec.reg()  # noqa: SLF001 - the fingerprints of the schema history
    return sorted(codec.MAGIC + fp for fp, writer in registry.by_fingerprint.items() if writer.name == "PartDelta")


def decode_part_deltas(kafka_df: DataFrame) -> DataFrame:
    """The part deltas (part >= 0) of a cbgpkafka DataFrame of ``deltas.parts``.  Only PartDelta records are
    decoded (the workers' PartDeltaColumns answer records, most of the topic, are left out by a header test in
    the JVM); undecodable records are the answers service's to dead-letter, so they are skipped here."""

    def decode(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for batch in batches:
            rows = []
            for value, partition, offset in zip(batch["value"], batch["partition"], batch["offset"]):
                try:
                    deltas = codec.part_delta_columns(bytes(value))
                except codec.CodecError:
                    continue
                if deltas.part < 0:
                    continue
                rows.extend((deltas.query_id, deltas.part, deltas.seq[i], deltas.diff[i],
                             json.dumps(deltas.binding(i)), deltas.snapshot[i], int(partition), int(offset))
                            for i in range(len(deltas)))
            if rows:
                yield pd.DataFrame(rows, columns=_PART_DELTA_COLUMNS)

    headers = [F.lit(h) for h in _part_delta_headers()]
    only_part_deltas = F.substring("value", 1, codec.HEADER_LEN).isin(*headers)
    return (kafka_df.where(only_part_deltas).select("value", "partition", "offset")
            .mapInPandas(decode, PART_DELTA_SCHEMA))


def _groups(deltas: pd.DataFrame, part_columns: list[tuple[str, ...]]) -> list[tuple[int, bool, int, int, list]]:
    """One query's part deltas in offset order, grouped by update: ``(seq, snapshot, last partition, last
    offset, [(part, sign, row), ...])``."""
    deltas = deltas.sort_values("kafka_offset", kind="stable")
    groups: list[tuple[int, bool, int, int, list]] = []
    previous: tuple[int, bool] | None = None
    group: list = []
    last_partition = last_offset = 0
    for part, seq, diff, binding, snapshot, partition, offset in zip(
            deltas["part"].tolist(), deltas["seq"].tolist(), deltas["sign"].tolist(), deltas["binding"].tolist(),
            deltas["snapshot"].tolist(), deltas["kafka_partition"].tolist(), deltas["kafka_offset"].tolist()):
        current = (seq, bool(snapshot))
        if current != previous:
            if previous is not None:
                groups.append((previous[0], previous[1], last_partition, last_offset, group))
            previous, group = current, []
        values = json.loads(binding)
        group.append((part, diff, tuple(values[c] for c in part_columns[part])))
        last_partition, last_offset = partition, offset
    if previous is not None:
        groups.append((previous[0], previous[1], last_partition, last_offset, group))
    return groups


def _apply(assembler: Assembler | None, sparql: str, groups: list) -> Iterator[tuple[Assembler, tuple, list]]:
    for group in groups:
        seq, snapshot, _partition, _offset, deltas = group
        if snapshot or assembler is None:
            assembler = Assembler(sparql)
        yield assembler, group, assembler.apply(deltas)


def assemble_group(query_id: str, deltas: pd.DataFrame, assembler: Assembler | None, sparql: str | None,
                   deltas_partitions: int) -> tuple[Assembler | None, list[tuple[bytes, bytes, int]], list]:
    """Apply one query's part deltas (in offset order) to ``assembler``; return it, the output records
    (PartDeltaColumns records of at most ``MAX_BATCH_DELTAS`` deltas) and the groups applied (the replay record).

    ``sparql`` is the query's current plan text (None: unregistered, so the deltas are dropped).  A run of
    snapshot deltas (a new registration or version) starts from empty parts.
    """
    out: list[tuple[bytes, bytes, int]] = []
    if sparql is None:
        return None, out, []
    target = query_partition(query_id, deltas_partitions)
    key = query_id.encode()
    groups = _groups(deltas, [part.columns for part in split_parts(sparql)])
    pending: list[tuple] = []
    columns: tuple[str, ...] | None = None

    def flush() -> None:
        if pending:
            out.append((key, codec.encode_part_delta_batch(query_id, WHOLE_QUERY_PART, columns, pending), target))
            pending.clear()

    for assembler, (seq, snapshot, partition, offset, _deltas), answers in _apply(assembler, sparql, groups):
        if columns is not None and columns != assembler.columns:
            flush()
        columns = assembler.columns
        source = assembly_source_partition(partition)
        for index, (diff, row) in enumerate(answers):
            pending.append((seq, diff, row, source, offset, index, snapshot, None))
            if len(pending) >= MAX_BATCH_DELTAS:
                flush()
    flush()
    return assembler, out, groups


def _replayer(sparql: str):  # noqa: ANN202
    def replay(assembler: Assembler | None, groups: list) -> Assembler | None:
        for assembler, _group, _answers in _apply(assembler, sparql, groups):
            pass
        return assembler

    return replay


class AssemblyProcessor(state_log.QueryStateProcessor):
    """One multi-part query's assembler in keyed state (see the module docstring)."""

    META_SCHEMA = META_SCHEMA

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        from spark.plan_topic import plan_cache

        query_id = key[0]
        deltas = pd.concat(list(rows), ignore_index=True)
        meta = self.meta.get() if self.meta.exists() else None
        version, sparql, tail_inputs = meta if meta is not None else (0, None, 0)
        # Refresh every time: this process may have cached the plan before an unregistration, and a stale
        # cache would keep answering a query nobody asks any more (one watermark look per partition).
        plan = plan_cache(self.kafka_config, self.plans_topic).refresh().get(query_id)
        assembler = None
        if plan is None:  # unregistered: drop its deltas and state
            new_sparql = None
        elif bool(deltas["snapshot"].any()) or sparql is None:  # a (re-)registration: take its current text
            new_sparql = plan.sparql
        else:
            new_sparql = sparql
        if new_sparql is not None and meta is not None and sparql is not None:
            assembler = _LIVE.evaluator(
                query_id, version, sparql, self.base, self.tail,
                lambda saved: None if saved is None else Assembler.from_state(sparql, saved), _replayer(sparql))
        assembler, out, groups = assemble_group(query_id, deltas, assembler, new_sparql, self.deltas_partitions)
        if assembler is None:
            state_log.clear_all((self.meta, self.base, self.tail))
            _LIVE.drop(query_id)
        else:
            if new_sparql != sparql:  # the replay must rebuild with the new text: start the log afresh
                self.tail.clear()
                self.base.update((state_log.dumps(assembler.to_state()),))
                tail_inputs = 0
            else:
                inputs = sum(len(g[4]) for g in groups)
                tail_inputs = state_log.save(self.base, self.tail, tail_inputs, inputs, groups, version + 1,
                                             assembler.state_entries, assembler.to_state, MIN_TAIL)
            version += 1
            self.meta.update((version, new_sparql, tail_inputs))
            _LIVE.put(query_id, version, new_sparql, assembler)
        if out:
            keys, values, partitions = zip(*out)
            yield pd.DataFrame({"key": list(keys), "value": list(values),
                                "partition": np.array(partitions, dtype=np.int32)})


def start_assembly(spark: SparkSession, kafka_options: Mapping[str, str], topics: Mapping[str, str],
                   deltas_partitions: int, checkpoint_dir: str, interval_s: float | None,
                   kafka_config: Mapping[str, Any], commit_group: str, single_owner: bool = False) -> StreamingQuery:
    """Start the assembly query (``interval_s=None``: availableNow, one pass, for tests and cron); it reads only
    while a product is registered whose parts the workers send here (``single_owner``: the workers run with
    ``--placement single-owner``)."""
    source = (spark.readStream.format("cbgpkafka").options(**kafka_options)
              .option("subscribe", topics["deltas.parts"]).option("commitGroup", commit_group)
              .option("onlyWhenNeededBy", "assembly").option("plansTopic", topics["queries.plans"])
              .option("fleetSingleOwner", str(single_owner).lower()).load())
    assembled = decode_part_deltas(source).groupBy("query_id").transformWithStateInPandas(
        AssemblyProcessor(dict(kafka_config), topics["queries.plans"], deltas_partitions),
        OUTPUT_SCHEMA, "append", "None")
    writer = (assembled.writeStream.queryName("cbgp-assembly").format("cbgpkafka").options(**kafka_options)
              .option("topic", topics["deltas.parts"]).option("checkpointLocation", checkpoint_dir))
    writer = writer.trigger(availableNow=True) if interval_s is None else \
        writer.trigger(processingTime=f"{interval_s} seconds")
    return writer.start()
