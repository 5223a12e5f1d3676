"""Which shards a worker checkpoints, and when a saved checkpoint can serve a restore (``services.state.shards``
keeps them; see its docstring for why a shard's engine is a function of its log and its queries).  No Kafka."""

from __future__ import annotations

import logging
from typing import Any, Iterable

from services.records import kv
from services.state.shards import dump_shard
from services.worker_core.shard import LogReader, QueryInfo, Shard

log = logging.getLogger("cbgp.worker")


def query_set(infos: Iterable[QueryInfo]) -> list[list]:
    return sorted([info.query_id, info.version] for info in infos)


def checkpointable(shard: Shard, infos: list[QueryInfo]) -> bool:
    """A shard whose whole state is its engine: no multi-centre query (evaluator state, probes in flight), no
    registration waiting for its point, no derived stream (whose output state is the core's)."""
    return not shard.probe_queries and not shard.pending and not any(i.uses_probes or i.stream for i in infos)


def shard_blob(shard: Shard, infos: list[QueryInfo]) -> bytes | None:
    """The checkpoint of ``shard`` holding ``infos`` as of its position, or None when it cannot be taken."""
    if not checkpointable(shard, infos):
        return None
    try:
        return dump_shard({"position": shard.position, "last_seq": shard.last_seq, "last_change": shard.last_change,
                           "queries": query_set(infos),
                           "versions": shard.versions, "outputs": shard.outputs, "engine": shard.engine})
    except Exception as exc:  # noqa: BLE001 - pickle raises PicklingError, TypeError, AttributeError...
        log.warning(kv(event="shard-checkpoint-skipped", kind=shard.kind, partition=shard.partition,
                       reason=f"{type(exc).__name__}: {exc}"))
        return None


def usable(saved: dict[str, Any] | None, shard: Shard, infos: list[QueryInfo], reader: LogReader) -> str | None:
    """Why ``saved`` cannot restore ``shard`` (committed at ``shard.position``) holding ``infos``, or None when it
    can: the same queries, a position at or below the committed one, and the same log (the last change before
    its position, term ids and all, is the one it recorded: topics deleted and written again with other data
    do not pass, even where their seqs coincide)."""
    if saved is None:
        return "no checkpoint"
    if saved["queries"] != query_set(infos):
        return "other queries"
    position = saved["position"]
    if position > shard.position:
        return f"position {position} is past the committed offset {shard.position}"
    last = _last_change(reader, shard, position)
    if last != saved["last_change"]:
        return f"the last change before position {position} is {last}, not {saved['last_change']}"
    return None


def _last_change(reader: LogReader, shard: Shard, position: int, within: int = 256) -> Any:
    """The last change of ``shard``'s log before ``position`` (records without changes, as Frontier marks,
    skipped; None when none is found within ``within`` records)."""
    end, chunk = position, 4
    while end > max(0, position - within):
        start = max(0, end - chunk)
        changes = list(reader(shard.kind, shard.partition, start, end))
        if changes:
            return changes[-1]
        end, chunk = start, chunk * 4
    return None


def adopt(shard: Shard, saved: dict[str, Any]) -> int:
    """Give ``shard`` the checkpoint's state; returns the position to replay its log from."""
    shard.engine = saved["engine"]
    shard.versions = saved["versions"]
    shard.outputs = saved["outputs"]
    shard.last_seq = saved["last_seq"]
    shard.last_change = saved["last_change"]
    return saved["position"]
