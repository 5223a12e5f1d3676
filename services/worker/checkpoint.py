"""Which shards a worker checkpoints, and when a saved checkpoint can serve a restore (``services.state.shards``
keeps them; see its docstring for why a shard's engine is a function of its log and its queries).  No Kafka.

A checkpoint serves whatever queries it was saved with: the restore adopts it, drops what the plans no longer
have, and gives the registrations it lacks their state the way a late registration gets it
(``WorkerCore.open_shard``).  The evaluator's probes in flight can only come from a checkpoint or from the log
since one, so a restore that refused a checkpoint for another query set would need the log from offset 0."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from services.wire.loglines import kv
from services.state.shards import dump_shard
from services.worker.shard import LogReader, QueryInfo, Shard

log = logging.getLogger("cbgp.worker")


def checkpointable(shard: Shard) -> bool:
    """A shard whose whole state is its own: its engine, and for multi-centre queries its evaluator (versioned
    stores, probes waiting, live counts) and probe bookkeeping; not one with a registration waiting for its
    point.  (A shard feeding a derived stream is one too: what it writes to updates.raw is made from its engine's
    deltas, in the transaction that commits them.)"""
    return not shard.pending


def shard_blob(shard: Shard, floors: dict[int, tuple] | None = None) -> bytes | None:
    """The checkpoint of ``shard`` as of its position (its queries are ``shard.versions``), or None when it
    cannot be taken.
    ``floors``: the other partitions' probe floors the worker has read (some from this shard's log before its
    position, which the restore does not read again)."""
    if not checkpointable(shard):
        return None
    try:
        return dump_shard({"position": shard.position, "last_seq": shard.last_seq, "last_change": shard.last_change,
                           "versions": shard.versions, "outputs": shard.outputs, "engine": shard.engine,
                           # multi-centre queries (services.worker.probes); their QueryInfo is rebound on adopt
                           "frontier": shard.frontier, "evaluator": shard.evaluator,
                           "probe_names": sorted(shard.probe_queries), "registered_at": shard.registered_at,
                           "ready_through": shard.ready_through, "ready_sent": shard.ready_sent,
                           "probe_channels": shard.probe_channels, "floors": floors})
    except Exception as exc:  # noqa: BLE001 - pickle raises PicklingError, TypeError, AttributeError...
        log.warning(kv(event="shard-checkpoint-skipped", kind=shard.kind, partition=shard.partition,
                       reason=f"{type(exc).__name__}: {exc}"))
        return None


@dataclass(slots=True)
class Due:
    """A shard to checkpoint, as it is when the checkpoint is taken: its position and queries, what its restore
    reads of other logs (``needs``), the probe floors it goes with, and whether it can be checkpointed at all."""

    key: tuple[str, int]
    shard: Shard | None
    position: int
    versions: tuple
    needs: dict[str, int]
    floors: dict[int, tuple]
    checkpointable: bool


def make_checkpoints(due: list[Due]) -> list[tuple[Due, bytes | None]]:
    """Each shard's checkpoint (None: it cannot be taken), ``Due.shard`` dropped: what a child process forked to
    checkpoint returns (``services.state.forked``)."""
    made = []
    for item in due:
        blob = shard_blob(item.shard, item.floors) if item.shard is not None else None
        made.append((replace(item, shard=None), blob))
    return made


def usable(saved: dict[str, Any] | None, shard: Shard, reader: LogReader, start: int = 0) -> str | None:
    """Why ``saved`` cannot restore ``shard`` (committed at ``shard.position``), or None when it can: a position
    at or below the committed one, and the same log (the last change before its position, term ids and all, is
    the one it recorded: topics deleted and written again with other data do not pass, even where their seqs
    coincide).  Its queries may differ from the plans' (see the module doc)."""
    if saved is None:
        return "no checkpoint"
    position = saved["position"]
    if position > shard.position:
        return f"position {position} is past the committed offset {shard.position}"
    last = _last_change(reader, shard, position, start)
    if last != saved["last_change"]:
        return f"the last change before position {position} is {last}, not {saved['last_change']}"
    return None


def _last_change(reader: LogReader, shard: Shard, position: int, start: int = 0, within: int = 256) -> Any:
    """The last change of ``shard``'s log in [start, position) (records without changes, as Frontier marks,
    skipped; None when none is found within ``within`` records)."""
    floor = start
    end, chunk = position, 4
    while end > max(floor, position - within):
        start = max(floor, end - chunk)
        changes = list(reader(shard.kind, shard.partition, start, end))
        if changes:
            return changes[-1]
        end, chunk = start, chunk * 4
    return None


def adopt(shard: Shard, saved: dict[str, Any], infos: list[QueryInfo]) -> int:
    """Give ``shard`` the checkpoint's state, its multi-centre queries bound to those of ``infos`` (the current
    plans) of the same name; returns the position to replay its log from.  Queries it holds that ``infos`` do
    not name stay in its engine, evaluator and ``outputs`` for the caller to drop (``stale``)."""
    shard.engine = saved["engine"]
    shard.versions = saved["versions"]
    shard.outputs = saved["outputs"]
    shard.last_seq = saved["last_seq"]
    shard.last_change = saved["last_change"]
    shard.frontier = saved["frontier"]
    shard.evaluator = saved["evaluator"]
    by_name = {name: info for info in infos for name, _part, _plan in info.probe_programs()}
    shard.probe_queries = {name: by_name[name] for name in saved["probe_names"] if name in by_name}
    shard.registered_at = saved["registered_at"]
    shard.ready_through = saved.get("ready_through", {})
    shard.ready_sent = saved["ready_sent"]
    shard.probe_channels = saved["probe_channels"]
    return saved["position"]


def stale(shard: Shard, keep: list[QueryInfo]) -> list[str]:
    """The queries an adopted checkpoint holds in ``shard`` that are not ``keep`` (unregistered since, replaced
    by another version, or owing a snapshot the state cannot give): to drop before the restore goes on."""
    wanted = {info.query_id: info.version for info in keep}
    held = set(shard.versions) | {query_id for query_id, _part in shard.outputs.values()}
    return sorted(query_id for query_id in held
                  if query_id not in wanted or shard.versions.get(query_id) != wanted[query_id])
