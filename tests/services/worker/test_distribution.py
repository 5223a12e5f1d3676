"""By-centre placement without Kafka: ingest -> N routed partitions, each held by its own worker core ->
deltas.parts partitions -> the answers service's seq-ordered release and DISTINCT consolidation -> answers,
with the partitions processed in random interleavings.  Per query and per update, the released deltas must
equal one whole Engine's (the contract: exact per update, in seq order, never a `-` before its `+`)."""

from __future__ import annotations

import json
import os
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from cbgp.algebra import ContinuousEngine
from cbgp.algebra.by_centre import leaf_parts
from cbgp.query.plan import BY_CENTRE, SINGLE_OWNER, decompose
from cbgp.query.sparql import parse_query
from services import codec
from services.codec import PartDeltaColumns
from services.answers import checkpoint as answers_checkpoint
from services.answers.core import AnswersCore
from services.ingest.core import IngestProcessor, RawRecord
from services.kafka.config import KafkaSettings
from services.answers.release import SeqRelease
from services.wire.registrations import change_seq_before
from services.state.shards import load_shard
from services.worker.core import WorkerCore
from services.worker.shard import decode_changes
from tests.fleet_support import EX, generate_patch

SETTINGS = KafkaSettings(topic_prefix="u.")
K, T, N, L = (f"<{EX}{name}>" for name in ("knows", "type", "name", "likes"))

BY_CENTRE_QUERIES = {
    # multi-centre components: stars at their centres' partitions, joined by probes
    "path3": f"SELECT * WHERE {{ ?a {K} ?b . ?b {K} ?c . ?c {L} ?d }}",
    "triangle": f"SELECT * WHERE {{ ?a {K} ?b . ?b {K} ?c . ?c {K} ?a }}",
    "fof3": f"SELECT DISTINCT ?a ?d WHERE {{ ?a {K} ?b . ?b {K} ?c . ?c {K} ?d }}",
    # products of parts: each part by centre, multiplied by the answers service in seq order
    "product": f"SELECT * WHERE {{ ?x {T} <{EX}Robot> . ?y {L} <{EX}Jazz> }}",
    "product_distinct": f"SELECT DISTINCT ?y WHERE {{ ?x {K} ?z . ?y {L} ?w . ?y {T} <{EX}Person> }}",
    # a star with attribute variables: centre ?x
    "attrs": f"SELECT ?x ?n ?t WHERE {{ ?x {N} ?n . ?x {T} ?t }}",
    # a 2-hop path: centre ?b, projected away (rows from several partitions coincide)
    "path": f"SELECT ?a ?c WHERE {{ ?a {K} ?b . ?b {K} ?c }}",
    # DISTINCT without the centre projected: consolidated by the answers service
    "fof": f"SELECT DISTINCT ?a WHERE {{ ?a {K} ?b . ?b {L} ?c }}",
    # a 2-cycle with a constant
    "mutual": f"SELECT * WHERE {{ ?a {K} ?b . ?b {K} ?a . ?a {T} <{EX}Person> }}",
    # a self-loop inside the star
    "selfish": f"SELECT ?x ?y WHERE {{ ?x {K} ?x . ?x {L} ?y }}",
    # a plain star, DISTINCT on an attribute
    "types": f"SELECT DISTINCT ?t WHERE {{ ?x {T} ?t . ?x {L} <{EX}Tea> }}",
    # a ground part with one subject gating a star: kept at the partition of <s0> (its triples are routed
    # there), multiplied with the star by the answers service
    "ground": f"SELECT * WHERE {{ <{EX}s0> {K} <{EX}s1> . <{EX}s0> {L} <{EX}Jazz> . ?y {L} <{EX}Jazz> }}",
    # products with multi-centre parts: those joined by probes, the star in the engine, multiplied by the
    # answers service; and two multi-centre parts, DISTINCT
    "product_path3": f"SELECT * WHERE {{ ?a {K} ?b . ?b {K} ?c . ?c {L} ?d . ?y {T} <{EX}Robot> }}",
    "product_two_paths": f"SELECT DISTINCT ?a ?e WHERE {{ ?a {K} ?b . ?b {K} ?c . ?c {L} ?d . "
                         f"?e {T} ?f . ?f {K} ?g . ?g {L} <{EX}Jazz> }}",
    # a ground query alone: one row while both triples hold
    "ground_only": f"SELECT * WHERE {{ <{EX}s1> {K} <{EX}s2> . <{EX}s1> {T} <{EX}Person> }}",
    # ground patterns of two subjects: a ground part per subject, each kept at its subject's partition, and
    # the answers service multiplies them with the star (and alone: a row while all three triples hold)
    "ground_two_subjects": f"SELECT * WHERE {{ <{EX}s0> {K} <{EX}s1> . <{EX}s1> {K} <{EX}s2> . ?y {L} <{EX}Jazz> }}",
    "ground_two_subjects_only": f"SELECT * WHERE {{ <{EX}s0> {K} <{EX}s1> . <{EX}s1> {K} <{EX}s2> . "
                                f"<{EX}s1> {T} <{EX}Person> }}",
}
SINGLE_OWNER_QUERIES = {
    # ?g also a subject: the graphs' instances differ in shape
    "graph_as_subject": f"SELECT * WHERE {{ GRAPH ?g {{ ?g {K} ?b . ?b {L} ?c }} }}",
}
QUERIES = {**BY_CENTRE_QUERIES, **SINGLE_OWNER_QUERIES}
# Per named graph (streams of quads, generate_patch(graphs=...)): a star and a single-centre component are
# evaluated where their centre lives, a multi-centre component by probes whose stores are keyed by (centre
# value, graph), each graph apart; DISTINCT across graphs by the answers service.
GRAPH_QUERIES = {
    "graph_star": f"SELECT * WHERE {{ GRAPH ?g {{ ?x {K} ?y . ?x {T} <{EX}Person> }} }}",
    "graph_path": f"SELECT ?g ?a ?c WHERE {{ GRAPH ?g {{ ?a {K} ?b . ?b {L} ?c }} }}",
    "graph_distinct": f"SELECT DISTINCT ?x WHERE {{ GRAPH ?g {{ ?x {L} ?z . ?x {T} ?t }} }}",
    "graph_path3": f"SELECT * WHERE {{ GRAPH ?g {{ ?a {K} ?b . ?b {K} ?c . ?c {L} ?d }} }}",
    "graph_triangle": f"SELECT ?a ?b ?c WHERE {{ GRAPH ?g {{ ?a {K} ?b . ?b {K} ?c . ?c {K} ?a }} }}",
    "graph_fof3_distinct": f"SELECT DISTINCT ?a ?d WHERE {{ GRAPH ?g {{ ?a {K} ?b . ?b {K} ?c . ?c {K} ?d }} }}",
    # products per named graph: each part's rows carry ?g, the answers service joins them on it
    "graph_product": f"SELECT * WHERE {{ GRAPH ?g {{ ?x {T} <{EX}Person> . ?y {L} ?z }} }}",
    "graph_product_distinct": f"SELECT DISTINCT ?x ?z WHERE {{ GRAPH ?g {{ ?x {T} ?t . ?y {L} ?z }} }}",
    "graph_product_path3": f"SELECT ?g ?a ?d ?y WHERE {{ GRAPH ?g {{ ?a {K} ?b . ?b {K} ?c . ?c {L} ?d . "
                           f"?y {T} <{EX}Person> }} }}",
    "graph_ground_gated": f"SELECT ?g ?y WHERE {{ GRAPH ?g {{ <{EX}s0> {T} <{EX}Person> . ?y {L} ?z }} }}",
}


def test_placement_is_by_centre_for_stars_and_single_centre_components() -> None:
    for name, text in {**QUERIES, **GRAPH_QUERIES}.items():
        plan = decompose(parse_query(text))
        by_centre = name in BY_CENTRE_QUERIES or name in GRAPH_QUERIES
        assert plan.placement == (BY_CENTRE if by_centre else SINGLE_OWNER), name
        assert plan.to_json()["placement"] == plan.placement
    path = decompose(parse_query(BY_CENTRE_QUERIES["path"]))
    assert path.to_json()["parts"][0]["centre"] == "?b"
    assert "state keyed by the value of ?b" in path.explain()
    ground = decompose(parse_query(BY_CENTRE_QUERIES["ground"]))
    assert ground.to_json()["parts"][0]["keyed_by"] == f"<{EX}s0>"
    assert f"kept at the partition of <{EX}s0>" in ground.explain()


def run_distributed(lines: list[str], queries: dict[str, str], n_routed: int, n_deltas: int, rng: random.Random,
                    late: set[str] = frozenset(), crash_rate: float = 0.0,
                    worker_crash_rate: float = 0.0, two_owners: bool = False,
                    registered: dict | None = None, checkpoint_rate: float = 0.0, stats: dict | None = None,
                    checkpoints_until_late: bool = False, late_point: float = 0.5, late_read: float = 0.5
                    ) -> dict[str, list[tuple[int, str, tuple]]]:
    """The fleet's cores in memory, each routed partition its own worker, processed in a random order;
    ``late`` queries are registered halfway; with ``worker_crash_rate`` a worker dies after a commit now and
    then and a new one restores its shard from the log at the committed offset, as the service does.
    ``two_owners``: when the late queries are registered, a second worker takes one routed partition over the
    way a rebalance on a broker without fencing does: it restores at the old owner's last commit (or an
    older one), reads the registration then or later, and both serve the partition for a while (each sends
    the registration's snapshot), then the old one stops.
    ``checkpoint_rate``: after a commit, a worker checkpoints the shards that moved with this probability (a
    checkpoint store shared by every worker, as the one on a pod's volume serves its next instance), and a
    restore starts from the checkpoint where one serves (``stats["restores"]`` / ``["from_checkpoint"]`` count
    the workers' restores after a crash, and those that used a checkpoint; ``["other_queries"]`` those whose
    checkpoint held other queries than the plans); ``checkpoints_until_late``: none is taken after the late
    registration (a long checkpoint interval), so the restores after it adopt checkpoints saved before it.
    ``late_point``: where in updates.encoded the late queries are registered (a fraction of its records);
    ``late_read``: how far the workers have gone through their logs when they read that registration.
    Returns per query the answers (seq, sign, sorted binding) in answer order; ``registered["seq"]`` is set to
    the seq the late queries are registered at (the last change of updates.encoded before their offset)."""
    ingest = IngestProcessor(SETTINGS, n_routed, n_deltas)
    routed: dict[int, list[bytes]] = {p: [] for p in range(n_routed)}
    encoded: list[bytes] = []  # updates.encoded: a registration answers as of its last seq before registered_at
    dictionary: dict[int, str] = {}
    chunks = [lines[i:i + 7] for i in range(0, len(lines), 7)]  # one raw record = one ingest transaction
    # A transaction's commit marker takes an offset of each partition it wrote, as on Kafka (no record has it).
    written: set[int] = set()

    def commit() -> None:
        for partition in sorted(written):
            routed[partition].append(None)
        written.clear()

    for offset, chunk in enumerate(chunks):
        for out in ingest.process(RawRecord(("\n".join(chunk) + "\n").encode(), offset=offset)):
            if out.topic == "u.dictionary":
                dictionary.update(codec.dictionary_entries(out.value))
            elif out.topic == "u.updates.routed":
                routed[out.partition].append(out.value)
                written.add(out.partition)
            elif out.topic == "u.updates.encoded":
                encoded.append(out.value)
        commit()
    topics = {"deltas.parts": "u.deltas.parts", "deadletter": "u.deadletter", "updates.routed": "u.updates.routed"}

    def reader(kind, partition, start, end):
        log = routed[partition] if kind == "routed" else encoded
        return [c for off, v in enumerate(log[start:end], start) if v is not None
                for c in decode_changes(kind, v)]

    def records(partition, start, end):  # end None: to the end
        return [(off, v) for off, v in enumerate(routed[partition][start:end], start) if v is not None]

    def terms(ids):  # the dictionary topic (a worker reads terms for the FILTERs pushed into its leaves)
        return {i: dictionary[i] for i in ids if i in dictionary}

    checkpoints = MemoryCheckpoints() if checkpoint_rate else None
    workers = [WorkerCore(topics, n_routed, 1, n_deltas, reader, assemble_in_spark=False, record_reader=records,
                          term_reader=terms, checkpoints=checkpoints)
               for _ in range(n_routed)]

    def send(outputs):
        for out in outputs:
            (routed if out.topic == "u.updates.routed" else deltas)[out.partition].append(out.value)
            if out.topic == "u.updates.routed":
                written.add(out.partition)
    for p, core in enumerate(workers):
        core.open_shard("routed", p, 0, None)
    deltas: dict[int, list[bytes]] = {d: [] for d in range(n_deltas)}

    plan_log: list[tuple[int, bytes, bytes]] = []  # queries.plans partition 0: (offset, key, value)

    def register(names, seq):
        # A burst of registrations read in one poll joins each shard together (half the runs), else one by one.
        together = (len(plan_log) + seq) % 2 == 0  # (not from rng: the scenarios stay as they were)
        first = len(plan_log)
        for number, name in enumerate(names):
            plan = {"query_id": name, "sparql": queries[name], "options": {}, "plan_json": "{}", "projected": [],
                    "registered_at_seq": seq, "version": 1}
            if number % 2:  # as the registry writes it now; the others as older plans, found by the workers
                plan["registered_at_change_seq"] = change_seq_before(lambda a, b: reader("whole", 0, a, b), seq)
            plan_log.append((len(plan_log), name.encode(), codec.encode("QueryPlan", plan)))
            if not together:
                for core in workers:
                    send(core.on_plan(0, *plan_log[-1], [core_p(core)])[0])
        if together:
            for core in workers:
                send(core.on_plans([(0, *record) for record in plan_log[first:]], [core_p(core)])[0])

    def core_p(core):
        return workers.index(core)

    def restart(p: int, committed: int) -> None:
        """Worker p died after its last commit: a new one reads queries.plans, then restores its shard."""
        metadata = workers[p].metadata()
        core = workers[p] = WorkerCore(topics, n_routed, 1, n_deltas, reader, assemble_in_spark=False,
                                       record_reader=records, term_reader=terms, checkpoints=checkpoints)
        for offset, key, value in plan_log:
            core.on_plan(0, offset, key, value, [p])
        checkpoints_before = checkpoints.loaded if checkpoints is not None else None
        send(core.open_shard("routed", p, committed, metadata))
        if stats is not None:
            stats["restores"] = stats.get("restores", 0) + 1
            used = checkpoints is not None and checkpoints.loaded is not checkpoints_before \
                and core.shards[("routed", p)].engine is checkpoints.loaded["engine"]
            stats["from_checkpoint"] = stats.get("from_checkpoint", 0) + used
            # (one saved with other queries than the plans name now: adopted, the difference caught up)
            stats["other_queries"] = stats.get("other_queries", 0) + (
                used and checkpoints.loaded_versions != core.shards[("routed", p)].versions)

    register([q for q in queries if q not in late], 0)
    # Interleave: each step, one partition's worker applies its next record (a transaction) and flushes.
    cursors = [0] * n_routed
    late_done = not late
    twin: dict | None = None  # two_owners: the new owner of routed partition twin["p"], until the old one stops
    while any(cursors[p] < len(routed[p]) for p in range(n_routed)) or twin is not None:
        if not late_done and sum(cursors) >= sum(len(v) for v in routed.values()) * late_read:
            late_done = True
            if two_owners:  # the old owner's last commit, or an older one: before the late registration
                p = rng.randrange(n_routed)
                start, metadata = rng.randint(max(0, cursors[p] - 3), cursors[p]), workers[p].metadata()
                known = len(plan_log)
            point = int(len(encoded) * late_point)
            register(sorted(late), point)  # every worker applies it when it reads it
            if registered is not None:
                registered["seq"] = max((change.seq for off, value in enumerate(encoded[:point])
                                         for change in decode_changes("encoded", value)), default=-1)
            if two_owners:  # the new owner restores meanwhile, and reads the registration then or later
                core = WorkerCore(topics, n_routed, 1, n_deltas, reader, assemble_in_spark=False, record_reader=records,
                                  term_reader=terms, checkpoints=checkpoints)
                read = known if rng.random() < 0.5 else len(plan_log)
                for offset, key, value in plan_log[:read]:
                    core.on_plan(0, offset, key, value, [p])
                send(core.open_shard("routed", p, start, metadata))
                twin = {"p": p, "core": core, "cursor": start, "plans": read, "stop": cursors[p] + rng.randint(0, 6)}
        if twin is not None:
            tp, core = twin["p"], twin["core"]
            if cursors[tp] >= min(twin["stop"], len(routed[tp])):  # the old owner stops; the new one goes on
                for offset, key, value in plan_log[twin["plans"]:]:
                    send(core.on_plan(0, offset, key, value, [tp])[0])
                workers[tp], cursors[tp], twin = core, twin["cursor"], None
                continue
            if rng.random() < 0.3:
                shard = core.shards[("routed", tp)]
                if twin["plans"] < len(plan_log) and rng.random() < 0.3:
                    for offset, key, value in plan_log[twin["plans"]:]:
                        send(core.on_plan(0, offset, key, value, [tp])[0])
                    twin["plans"] = len(plan_log)
                elif twin["cursor"] < len(routed[tp]):
                    if routed[tp][twin["cursor"]] is not None:
                        send(core.on_routed(shard, twin["cursor"], routed[tp][twin["cursor"]], None)[0])
                    twin["cursor"] += 1
                send(core.flush_batches())
                commit()
                continue
        if not any(cursors[q] < len(routed[q]) for q in range(n_routed)):
            continue
        p = rng.choice([q for q in range(n_routed) if cursors[q] < len(routed[q])])
        core, shard = workers[p], workers[p].shards[("routed", p)]
        for _ in range(rng.randint(1, 3)):
            if cursors[p] >= len(routed[p]):
                break
            offset, value = cursors[p], routed[p][cursors[p]]
            if value is not None:  # (a commit marker: the consumer never sees it)
                send(core.on_routed(shard, offset, value, None)[0])  # changes, frontier marks, probes
            cursors[p] += 1
        send(core.flush_batches())
        commit()
        if checkpoints is not None and rng.random() < checkpoint_rate and not (checkpoints_until_late and late_done):
            checkpoints.put(core.checkpoint_blobs([("routed", p)]))
        if worker_crash_rate and rng.random() < worker_crash_rate:
            restart(p, cursors[p])
    if stats is not None:  # changes pushed FILTERs kept out of the evaluators' state (multi-centre leaves)
        stats["gated_in_evaluators"] = sum(state.gated for core in workers for shard in core.shards.values()
                                           if shard.evaluator is not None
                                           for state in shard.evaluator.queries.values())
    return answers_side(deltas, n_routed, dictionary, queries, rng, crash_rate, checkpoint_rate, stats,
                        plans=[key.decode() for _offset, key, _value in plan_log])


class MemoryCheckpoints:
    """``services.state.shards.ShardCheckpoints`` without RocksDB: the pickled blobs, loaded again per restore."""

    def __init__(self) -> None:
        self.blobs: dict[tuple[str, int], bytes] = {}
        self.loaded: dict | None = None  # the last checkpoint a restore asked for

    def get(self, kind: str, partition: int, committed: int | None = None) -> dict | None:
        blob = self.blobs.get((kind, partition))
        self.loaded = None if blob is None else load_shard(blob)
        if self.loaded is not None:
            self.loaded["from"] = "memory"
            self.loaded_versions = dict(self.loaded["versions"])  # (before the restore changes them)
        return self.loaded

    def put(self, shards: list[tuple[str, int, bytes, int]]) -> int:
        for kind, partition, blob, *_position in shards:
            self.blobs[(kind, partition)] = blob
        return len(shards)


def answers_side(deltas: dict[int, list[bytes]], n_routed: int, dictionary: dict[int, str], queries: dict[str, str],
                 rng: random.Random, crash_rate: float, checkpoint_rate: float = 0.0,
                 stats: dict | None = None, plans: list[str] | None = None) -> dict[str, list[tuple[int, str, tuple]]]:
    """Each deltas.parts partition read in order through the release into the answers core, committing after
    every record; with ``crash_rate``, the answers service "dies" after a commit now and then and a new one
    restores as the service does (answers log -> core, commit metadata -> release, DISTINCT counts and product
    assemblers from the records before the committed read position), or the group hands the partition back to
    the same instance unchanged (it keeps its released state), and reads again from the committed offset.
    ``checkpoint_rate``: after a commit, the partition is checkpointed with this probability
    (``services.answers.checkpoint``), and a new instance restores from the last checkpoint plus the answers and
    deltas after it (``stats["answers_from_checkpoint"]`` counts those restores).  ``plans``: the queries in
    queries.plans order, read by every instance before it restores (``SeqRelease.note_plan``, every one taken for
    gated: the commit metadata then names only the gates opened above the lowest one still shut;
    ``stats["opened_from_plans"]`` counts the gates a restore found open from the plans' order alone)."""
    produced: dict[str, list[tuple[int, str, tuple]]] = {name: [] for name in queries}
    for d in deltas:
        log: list = []  # this partition's committed Answer outputs (the answers topic)
        committed = (0, None)
        checkpoint: bytes | None = None

        def fresh():
            release = SeqRelease(n_routed, lambda query_id, _version: queries.get(query_id), dictionary)
            if plans is not None:
                release.plans_read = {0: len(plans)}
                for plan_offset, name in enumerate(plans):
                    release.note_plan(name, 1, d, 0, plan_offset)
            core = AnswersCore("u.answers", "u.answers.current", "u.deadletter", "u.deltas.parts")
            saved = load_shard(checkpoint) if checkpoint is not None else None
            last = log[saved["answers_end"] - 1].value if saved and saved["answers_end"] else None
            if answers_checkpoint.unusable(saved, committed[0], len(log), last) is not None:
                saved = None
            elif stats is not None:
                stats["answers_from_checkpoint"] = stats.get("answers_from_checkpoint", 0) + 1
            if saved is not None:
                answers_checkpoint.adopt(core, d, saved)
            for out in log[saved["answers_end"] if saved else 0:]:
                core.restore(d, out.value, dict(out.headers or ()))
            end = release.restore(d, committed[1], saved=saved["release"] if saved else None)
            if stats is not None and committed[1]:
                named = {(q, v) for q, v, *_as_of in json.loads(committed[1]).get("opened", [])}
                stats["opened_from_plans"] = stats.get("opened_from_plans", 0) + len(
                    set(release.partitions[d].opened) - named)
            for off in range(saved["position"] if saved else 0, end):
                if codec.frontier_of(deltas[d][off]) is None and codec.probe_ready_of(deltas[d][off]) is None:
                    release.restore_counts(d, off, codec.part_delta_columns(deltas[d][off]))
            return release, core

        release, core = fresh()
        offset = last_crash = 0
        while offset < len(deltas[d]):
            value = deltas[d][offset]
            ready = release.on_record(d, offset, value)
            for source_offset, origin, cols in ready:
                log += [o for o in core.on_record(d, source_offset, value, origin, dictionary.get, cols)
                        if o.topic == "u.answers"]
            release.held_terms.collect()  # (as the service does after a batch: what operators let go is freed)
            offset += 1
            committed = release.commit_position(d, offset)
            if checkpoint_rate and rng.random() < checkpoint_rate:  # (once the transaction committed)
                checkpoint = answers_checkpoint.partition_blob(core, release, d, *committed, len(log),
                                                               log[-1].value if log else None)
                assert checkpoint is not None, "the answers state pickles"
            if crash_rate and offset > last_crash and rng.random() < crash_rate:  # each record crashes once at most
                if rng.random() < 0.5:
                    release, core = fresh()
                else:  # or the group gives the partition back unchanged: this instance keeps what it released
                    release.restore(d, committed[1], keep_counts=True)
                last_crash, offset = offset, committed[0]
        assert not release.partitions[d].heap and not release.partitions[d].fast, \
            "every delta is released once every frontier passed the end"
        assert not release.partitions[d].gates, "every probed registration is released"
        numbers: dict[tuple[str, int], int] = {}
        for out in log:
            record = codec.decode("Answer", out.value)
            stream = (record["query_id"], record["version"])
            assert record["n"] == numbers.get(stream, 0) + 1, f"{stream}: answer numbers with a gap or repeated"
            numbers[stream] = record["n"]
            produced[record["query_id"]].append((record["seq"], record["sign"], tuple(sorted(
                (v, t["value"]) for v, t in record["binding"].items()))))
    return produced


def run_whole(lines: list[str], queries: dict[str, str]) -> dict[str, Counter]:
    """One engine on the total order (operator queries' too): per query, Counter of (seq, sign, binding) (seq =
    effective change; 0: the answers at registration, before any change)."""
    engine = ContinuousEngine()
    out: dict[str, Counter] = {name: Counter() for name in queries}
    for name, text in queries.items():
        for _name, sign, row in engine.register(name, text):
            out[name][(0, "+" if sign > 0 else "-", _binding(engine.decode_row(name, row)))] += 1
    present: set[tuple[str, str, str, str | None]] = set()
    seq = 0
    for line in lines:
        op, rest = line[0], line[2:-2]
        s, p, o = rest.split(" ", 2)
        g = None
        if o.startswith("<") and " " in o:  # a quad (generate_patch(graphs=...)): an IRI object, then the graph
            o, g = o.split(" ")
        if (op == "A") == ((s, p, o, g) in present):
            continue  # not an effective change: no seq
        present.add((s, p, o, g)) if op == "A" else present.discard((s, p, o, g))
        seq += 1
        for name, sign, row in engine.apply_terms(1 if op == "A" else -1, s, p, o, g):
            out[name][(seq, "+" if sign > 0 else "-", _binding(engine.decode_row(name, row)))] += 1
    return out


def _binding(binding: dict[str, str]) -> tuple:
    return tuple(sorted((v, t.split('"')[1] if t.startswith('"') else t.strip("<>")) for v, t in binding.items()))


# 120 streams per `make test` (about 35 s); CBGP_DISTRIBUTION_STREAMS=1000 for a deep run before a release.
STREAMS = int(os.environ.get("CBGP_DISTRIBUTION_STREAMS", "120"))


@settings(max_examples=STREAMS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n_routed=st.sampled_from([1, 2, 3, 4, 8]), n_deltas=st.sampled_from([1, 3]),
       subjects=st.integers(3, 9), length=st.integers(20, 160), crash_rate=st.sampled_from([0.0, 0.0, 0.15]),
       worker_crash_rate=st.sampled_from([0.0, 0.0, 0.1]), checkpoint_rate=st.sampled_from([0.0, 0.3]))
def test_distributed_evaluation_equals_one_engine_per_update_in_any_interleaving(seed, n_routed, n_deltas, subjects,
                                                                                  length, crash_rate,
                                                                                  worker_crash_rate,
                                                                                  checkpoint_rate) -> None:
    """...and with the answers service and the workers restarted from their commits at random points, the
    workers from their shard checkpoints (multi-centre evaluators included) or from offset 0."""
    rng = random.Random(seed)
    lines = generate_patch(length, seed=seed, subjects=subjects)  # deletions, duplicates, absent deletes, self-loops
    got = run_distributed(lines, BY_CENTRE_QUERIES, n_routed, n_deltas, rng, crash_rate=crash_rate,
                          worker_crash_rate=worker_crash_rate, checkpoint_rate=checkpoint_rate)
    want = run_whole(lines, BY_CENTRE_QUERIES)
    for name in BY_CENTRE_QUERIES:
        answers = got[name]
        assert [seq for seq, _sign, _b in answers] == sorted(seq for seq, _sign, _b in answers), \
            f"{name}: answers not in seq order"
        assert Counter(answers) == want[name], f"{name}: per-update deltas differ from one engine"
        current: Counter = Counter()
        for _seq, sign, binding in answers:
            current[binding] += 1 if sign == "+" else -1
            assert current[binding] >= 0, f"{name}: a '-' before the '+' it retracts"


@pytest.mark.parametrize("seed", range(12))
def test_late_registration_gets_a_snapshot_then_exact_live_deltas(seed: int) -> None:
    """Queries registered halfway: snapshot rows (marked with the registration seq) then live deltas, whose
    sum is the final answer of one engine; the live part stays in seq order.  Workers and the answers service
    die now and then, also while a registration's gate is still shut (nothing of it was released yet)."""
    rng = random.Random(seed)
    lines = generate_patch(300, seed=seed, subjects=6)
    late = set(BY_CENTRE_QUERIES)
    registered: dict = {}
    got = run_distributed(lines, BY_CENTRE_QUERIES, 4, 2, rng, late=late, worker_crash_rate=0.05 * (seed % 2),
                          crash_rate=0.1 * (seed % 3 == 0), registered=registered)
    assert_late_answers(got, run_whole(lines, BY_CENTRE_QUERIES), late, registered["seq"])


@pytest.mark.parametrize("seed", range(10))
def test_workers_and_answers_restored_from_checkpoints_answer_exactly(seed: int) -> None:
    """Workers die often and restore from their shard checkpoints (the multi-centre evaluators' versioned stores,
    waiting probes and live counts with them) plus the log after them; so does the answers service, from its
    partition checkpoints (answer streams, DISTINCT counts, product assemblers, gates opened) plus the answers
    and deltas after them; half the seeds register the queries halfway: per update one engine's deltas, and
    many restores used a checkpoint, some saved before the late registrations."""
    rng = random.Random(seed)
    lines = generate_patch(300, seed=seed, subjects=6)
    late = set(BY_CENTRE_QUERIES) if seed % 2 else set()
    registered: dict = {}
    stats: dict = {}
    got = run_distributed(lines, BY_CENTRE_QUERIES, 1 + seed % 4, 1 + seed % 2, rng, late=late,
                          worker_crash_rate=0.2, crash_rate=0.15, checkpoint_rate=0.6, registered=registered,
                          stats=stats, checkpoints_until_late=seed % 4 == 1)
    assert_exact(got, run_whole(lines, BY_CENTRE_QUERIES), BY_CENTRE_QUERIES, registered["seq"] if late else None)
    assert stats["restores"] >= 5 and stats["from_checkpoint"] >= stats["restores"] // 3, stats
    if late and seed % 4 == 1:  # (checkpoints stopped at the registration: restores adopt older ones)
        assert stats["other_queries"] > 0, stats
    assert stats.get("answers_from_checkpoint", 0) >= 3, stats
    assert stats.get("opened_from_plans", 0) > 0, "restores found opened gates the metadata did not name"


@pytest.mark.parametrize("seed", range(16))
def test_named_graph_queries_by_centre_equal_one_engine(seed: int) -> None:
    """``GRAPH ?g`` stars and single-centre components over a stream of quads in three named graphs (and the
    default graph), evaluated per graph where their centre lives: per update one engine's deltas, DISTINCT
    across graphs applied by the answers service; odd seeds register them halfway (a snapshot, then live
    deltas); workers and the answers service die now and then."""
    want = check_seeded_run(generate_patch(360, seed=seed, subjects=5, graphs=3), GRAPH_QUERIES, seed)
    assert all(want[name] for name in GRAPH_QUERIES), "every query has answers in the stream"


def check_seeded_run(lines: list[str], queries: dict[str, str], seed: int) -> dict[str, Counter]:
    """The simulated fleet over ``lines`` as ``seed`` sets it up (1-4 routed and 1-2 deltas partitions; odd
    seeds register the queries halfway; seeds 1 mod 3 crash workers, 0 mod 3 the answers service; seeds 2 and 3
    mod 4 checkpoint the workers' shards), checked against one engine per update; returns the engine's deltas."""
    rng = random.Random(seed)
    late = set(queries) if seed % 2 else set()
    registered: dict = {}
    stats: dict = {}
    got = run_distributed(lines, queries, 1 + seed % 4, 1 + seed % 2, rng, late=late,
                          worker_crash_rate=0.05 * (seed % 3 == 1), crash_rate=0.1 * (seed % 3 == 0),
                          registered=registered, checkpoint_rate=0.3 * (seed % 4 >= 2), stats=stats)
    if seed % 3 == 0 and seed % 4 >= 2:
        assert stats.get("answers_from_checkpoint", 0) > 0, "the answers service restored from a checkpoint"
    want = run_whole(lines, queries)
    assert_exact(got, want, queries, registered["seq"] if late else None)
    return want


def assert_exact(got: dict[str, list[tuple[int, str, tuple]]], want: dict[str, Counter], names,
                 late_seq: int | None) -> None:
    """Per update one engine's deltas; for queries registered late (at ``late_seq``), as
    :func:`assert_late_answers` checks them."""
    if late_seq is not None:
        assert_late_answers(got, want, names, late_seq)
        return
    for name in names:
        assert Counter(got[name]) == want[name], f"{name}: per-update deltas differ from one engine"


def assert_late_answers(got: dict[str, list[tuple[int, str, tuple]]], want: dict[str, Counter], names,
                        registered_seq: int) -> None:
    """Late registrations at ``registered_seq``: one snapshot labelled with that seq (first), then per update
    after it exactly one engine's deltas; never a '-' before its '+'; the final answers one engine's."""
    for name in names:
        answers = got[name]
        final_got: Counter = Counter()
        for _seq, sign, binding in answers:
            final_got[binding] += 1 if sign == "+" else -1
            assert final_got[binding] >= 0, f"{name}: a '-' before the '+' it retracts"
        final_want: Counter = Counter()
        for (_seq, sign, binding), k in want[name].items():
            final_want[binding] += k if sign == "+" else -k
        assert +final_got == +final_want, name
        as_of = registered_seq
        snapshot = [a for a in answers if a[0] <= as_of]
        assert answers[:len(snapshot)] == snapshot and all(a[0] == as_of and a[1] == "+" for a in snapshot), \
            f"{name}: the snapshot is not first, or not as of {as_of}"
        assert Counter(a for a in answers if a[0] > as_of) == \
            Counter({key: k for key, k in want[name].items() if key[0] > as_of}), f"{name}: live deltas differ"


def check_late_takeover(seed: int, monkeypatch, queries: dict[str, str], crash_rate: float = 0.0) -> None:
    """``queries`` registered late while two workers own a routed partition (``two_owners``), over 1-4 routed
    partitions; odd seeds cut each ingest transaction into records of 2 changes.  Exact as with one owner."""
    if seed % 2:
        monkeypatch.setattr("services.ingest.core.MAX_BATCH_CHANGES", 2)
    rng = random.Random(seed)
    lines = generate_patch(200, seed=seed, subjects=5)
    registered: dict = {}
    got = run_distributed(lines, queries, 1 + seed % 4, 1 + seed % 2, rng, late=set(queries), two_owners=True,
                          crash_rate=crash_rate, registered=registered)
    assert_late_answers(got, run_whole(lines, queries), queries, registered["seq"])


@pytest.mark.parametrize("seed", range(60))
def test_two_owners_of_a_routed_partition_during_a_late_registration_answer_once(seed: int, monkeypatch) -> None:
    """A rebalance on a broker that does not fence the old owner: a new worker restores a routed partition
    while the old one still serves it, and both apply a late registration (before, the two took their
    snapshots at their own positions, and a product multiplied both: a kill -9 fault run found it).  The
    answers are exact as in a run with one owner.  Odd seeds cut each ingest transaction into records of 2
    changes, so the registration can fall inside a transaction and the routed record at its point can hold
    changes from both sides of it (their deltas belong to the snapshot)."""
    queries = {name: BY_CENTRE_QUERIES[name] for name in ("product", "product_distinct", "attrs", "path",
                                                          "ground")}
    check_late_takeover(seed, monkeypatch, queries, crash_rate=0.1 * (seed % 3 == 0))


@pytest.mark.parametrize("seed", range(60))
def test_two_owners_during_a_late_multi_centre_registration_answer_once(seed: int, monkeypatch) -> None:
    """The takeover of the test above with multi-centre queries (a path, a triangle, a product with a probed
    part) registered during it: the owner that reads the plan after passing the registration's point used to
    send its own registration probes, made from a longer log, beside the other owner's (both taken: 26 of 60
    such streams went wrong).  Now it rebuilds the query's outputs from the log, step by step as the other
    owner made them, with the same segments and delta keys, and the receivers take one copy."""
    queries = {name: BY_CENTRE_QUERIES[name] for name in ("path3", "product_path3", "triangle", "attrs")}
    check_late_takeover(seed, monkeypatch, queries, crash_rate=0.1 * (seed % 3 == 0))


@pytest.mark.parametrize("seed", range(40))
def test_two_owners_of_a_routed_partition_answer_multi_centre_queries_once(seed: int, monkeypatch) -> None:
    """The same takeover with multi-centre queries running: both owners answer the probes that reach the
    partition and send the probes of its updates, so every other partition gets each twice, and the origin
    would count the acks of both copies (its probe counts never reached zero: 18 of 30 such streams stalled
    every by-centre answer).  Receivers take each (sender, cause, chunk) segment once; odd seeds cut the
    segments into chunks of 3 items.  Seeds 2 and 3 mod 4 let each partition choose its routes by its counts
    every few changes (the two owners, and a restore, must choose alike: a probe names its route and a
    receiver takes either owner's copy).  Seeds 4-7 mod 8 checkpoint the workers' shards, so the new owner
    may start from a checkpoint, with the segments the old owner had taken.  Exact per update as with one
    owner."""
    if seed % 2:
        monkeypatch.setattr("services.worker.probes.MAX_PER_RECORD", 3)
    if seed % 4 >= 2:
        monkeypatch.setattr("cbgp.distributed.evaluator.RECHOOSE_AT", 5)
        monkeypatch.setattr("cbgp.distributed.evaluator.RECHOOSE_EVERY", 7)
        monkeypatch.setattr("cbgp.distributed.versioned_state.MIN_KEYS", 1)
    rng = random.Random(seed)
    lines = generate_patch(200, seed=seed, subjects=5)
    probed = ("path3", "triangle", "fof3", "product_path3")
    queries = {name: BY_CENTRE_QUERIES[name] for name in (*probed, "attrs")}
    registered: dict = {}
    got = run_distributed(lines, queries, 2 + seed % 3, 1 + seed % 2, rng, late={"attrs"}, two_owners=True,
                          crash_rate=0.1 * (seed % 3 == 0), registered=registered,
                          checkpoint_rate=0.5 * (seed % 8 >= 4))
    want = run_whole(lines, queries)
    for name in probed:
        assert Counter(got[name]) == want[name], f"{name}: per-update deltas differ from one engine"
    assert_late_answers(got, want, ["attrs"], registered["seq"])


def test_a_restored_release_counts_distinct_rows_once_and_keeps_nothing_of_plain_deltas() -> None:
    """Restore reads the released records again: a DISTINCT batch's rows are counted (a second owner's copy
    of them once), a plain query's deltas leave no state behind."""
    release = SeqRelease(1)
    release.restore(0, '{"frontiers": {"0": 10}, "end": 3}')

    def batch(distinct: bool) -> PartDeltaColumns:
        return PartDeltaColumns("q", -1, ["x"], [4], [1], [7], [0], [2], [0], [False], [None], 1, distinct)
    release.restore_counts(0, 0, batch(False))
    assert not release.partitions[0].counts and not release.partitions[0].released_keys
    release.restore_counts(0, 1, batch(True))
    release.restore_counts(0, 2, batch(True))  # the same delta key: the other owner's copy
    assert release.partitions[0].counts == {("q", 1): {(7,): 1}}


def test_a_query_without_probes_is_released_at_the_applied_frontier_a_probed_one_at_the_completed() -> None:
    """A worker's Frontier says how far each routed partition has applied its changes and how far every delta
    they cause, probes included, has been sent.  A query evaluated without probes has all its deltas of a change
    once the change is applied: released then, while a probed query's wait for the completed frontier.  The
    commit keeps both, so a restart skips exactly what was released."""
    release = SeqRelease(2)
    release.restore(0, None)

    def batch(query: str, source: int, offset: int, probed: bool) -> PartDeltaColumns:
        return PartDeltaColumns(query, -1, ["x"], [5], [1], [7], [source], [offset], [0], [False], [None], 1,
                                probed=probed)
    seqs = lambda released: [(cols.query_id, seq) for _o, _origin, cols in released for seq in cols.seq]  # noqa: E731
    assert release.on_deltas(0, 0, None, batch("star", 0, 10, False)) == []
    assert release.on_deltas(0, 1, None, batch("cycle", 1, 11, True)) == []
    # an old worker's record (no applied frontiers): applied = completed, nothing moves
    frontier = codec.frontiers_of(codec.encode_frontier({0: 3, 1: 3}))
    assert frontier == ({0: 3, 1: 3}, {0: 3, 1: 3})
    assert release.on_frontier(0, *frontier) == []
    completed, applied = codec.frontiers_of(codec.encode_frontier({0: 3, 1: 4}, {0: 6, 1: 5}))
    assert seqs(release.on_frontier(0, completed, applied)) == [("star", 5)]
    assert release.held() == 1
    offset, metadata = release.commit_position(0, 2)
    assert offset == 1 and json.loads(metadata)["applied"] == {"0": 6, "1": 5}

    restarted = SeqRelease(2)
    assert restarted.restore(0, metadata) == 2
    assert restarted.on_deltas(0, 1, None, batch("cycle", 1, 11, True)) == []  # read again from the commit: held
    assert restarted.on_deltas(0, 0, None, batch("star", 0, 10, False)) == []  # (a copy: released before it)
    assert restarted.held() == 1
    assert seqs(restarted.on_frontier(0, {0: 5, 1: 5}, {0: 6, 1: 5})) == [("cycle", 5)]
    assert restarted.held() == 0


def test_a_frontier_whose_arrays_differ_in_length_is_dead_lettered_and_moves_nothing() -> None:
    """A Frontier naming two partitions with one applied seq is corrupt: the release refuses it saying so in one
    line, no frontier moves, and the answers core's dead letter carries that line."""
    from services.answers.core import AnswersCore

    release = SeqRelease(2)
    release.restore(0, None)
    corrupt = codec.encode("Frontier", {"partition": [0, 1], "seq": [3, 4], "applied": [9]})
    with pytest.raises(codec.CodecError, match="corrupt Frontier: partition, seq and applied arrays differ") as refused:
        release.on_record(0, 5, corrupt)
    assert release.watermark(0) == -1 and release.applied_watermark(0) == -1
    dead = AnswersCore("a", "c", "d", "parts").refused(0, 5, str(refused.value), corrupt)
    record = codec.decode("DeadLetter", dead.value)
    assert dead.topic == "d" and record["reason"] == "schema-mismatch" and record["offset"] == 5
    assert record["message"] == str(refused.value) and "\n" not in record["message"]


def test_an_opened_gate_keeps_its_as_of_across_restarts_and_drops_later_copies() -> None:
    """Once a registration's gate opened, a delta of it up to its as_of can only be a second owner's copy (every
    frontier had passed as_of): dropped.  The as_of is committed with the gate; a commit written before it was
    kept restores the gate with as_of unknown (nothing dropped)."""
    release = SeqRelease(1)
    release.restore(0, '{"frontiers": {"0": 10}, "end": 0, "opened": [["q", 1, 6]]}')
    assert release.partitions[0].opened == {("q", 1): 6}
    assert json.loads(release.commit_position(0, 0)[1])["opened"] == [["q", 1, 6]]

    def batch(*seqs: int) -> PartDeltaColumns:
        n = len(seqs)
        return PartDeltaColumns("q", -1, ["x"], list(seqs), [1] * n, list(range(n)), [0] * n, [3] * n,
                                list(range(n)), [False] * n, [None] * n, 1, False, True)
    released = release.on_deltas(0, 0, None, batch(5, 6, 7))
    assert [seq for _offset, _origin, cols in released for seq in cols.seq] == [7]
    release.restore(0, '{"frontiers": {"0": 10}, "end": 0, "opened": [["q", 1]]}')
    assert release.partitions[0].opened == {("q", 1): -1}


def test_a_retraction_from_one_partition_never_overtakes_the_assertion_from_another() -> None:
    """Built to race: row (a, c) of the 2-hop path appears through centre b1 and disappears through centre
    b2, whose partitions differ; partition of b2 is processed entirely first.  Released in seq order."""
    a, c = f"<{EX}a>", f"<{EX}c>"
    n_routed = 4
    bs = [f"<{EX}b{i}>" for i in range(40)]
    from cbgp.terms import stable_term_id
    b1 = bs[0]
    b2 = next(b for b in bs if stable_term_id(b) % n_routed != stable_term_id(b1) % n_routed
              and stable_term_id(b) % n_routed not in (stable_term_id(a) % n_routed, stable_term_id(c) % n_routed))
    lines = [f"A {a} {K} {b2} .", f"A {b2} {K} {c} .", f"A {a} {K} {b1} .", f"A {b1} {K} {c} .",
             f"D {b2} {K} {c} .", f"A {b2} {K} {c} .", f"D {b1} {K} {c} ."]
    query = {"path": BY_CENTRE_QUERIES["path"]}

    class Adversary(random.Random):
        """Always picks the partition of b2 first when it has work."""

        def choice(self, seq):  # noqa: ANN001
            target = stable_term_id(b2) % n_routed
            return target if target in seq else seq[0]

        def randint(self, a, b):  # noqa: ANN001
            return b

    got = run_distributed(lines, query, n_routed, 1, Adversary())["path"]
    assert [sign for _seq, sign, _b in got] == ["+", "+", "-", "+", "-"]
    assert [seq for seq, _sign, _b in got] == sorted(seq for seq, _sign, _b in got)


def test_explain_names_each_part_placement_and_windowed_queries_are_the_spark_job(tmp_path) -> None:
    import io
    import json

    from cbgp.engine_cli import WINDOWED_PLACEMENT, explain

    plain = tmp_path / "path.rq"
    plain.write_text(BY_CENTRE_QUERIES["path"])
    out = io.StringIO()
    explain(str(plain), True, out)
    data = json.loads(out.getvalue())
    assert data["placement"] == BY_CENTRE and [p["placement"] for p in data["parts"]] == [BY_CENTRE]
    windowed = tmp_path / "w.rq"
    windowed.write_text(f"PREFIX : <{EX}>\nSELECT ?a ?c FROM NAMED WINDOW :w ON :s [RANGE PT10S STEP PT1S]\n"
                        "WHERE { WINDOW :w { ?a :knows ?b . ?b :knows ?c } }")
    out = io.StringIO()
    explain(str(windowed), True, out)
    assert json.loads(out.getvalue())["placement"] == WINDOWED_PLACEMENT
    out = io.StringIO()
    explain(str(windowed), False, out)
    assert f"placement in the fleet: {WINDOWED_PLACEMENT}" in out.getvalue() and BY_CENTRE not in out.getvalue()
    counted = tmp_path / "count.rq"  # operators over a window: the Spark job too
    counted.write_text(f"PREFIX : <{EX}>\nSELECT ?b (COUNT(?a) AS ?n) FROM NAMED WINDOW :w ON :s [RANGE PT10S]\n"
                       "WHERE { WINDOW :w { ?a :knows ?b FILTER(?a != ?b) } } GROUP BY ?b")
    out = io.StringIO()
    explain(str(counted), True, out)
    data = json.loads(out.getvalue())
    assert data["placement"] == WINDOWED_PLACEMENT and data["window"]["range_ms"] == 10_000
    out = io.StringIO()
    explain(str(counted), False, out)
    assert "event-time window: tumbling" in out.getvalue() and "Aggregate by 1 key(s): COUNT" in out.getvalue()
    assert f"placement in the fleet: {WINDOWED_PLACEMENT}" in out.getvalue() and BY_CENTRE not in out.getvalue()


def test_a_product_part_delta_written_twice_is_multiplied_once() -> None:
    """During a rebalance two workers may hold a routed partition for a moment and both write its deltas;
    the answers service drops a repeated answer key, but a repeated part delta must not be multiplied again."""
    text = BY_CENTRE_QUERIES["product"]
    release = SeqRelease(1, lambda _query_id, _version: text)
    release.restore(0, None)

    def part(index: int, variable: str, value: int, seq: int) -> PartDeltaColumns:
        return PartDeltaColumns("product", index, [variable], [seq], [1], [value], [0], [seq], [0], [False],
                                [None], 1, False, False)

    answers = []
    for offset, deltas in enumerate([part(0, "x", 11, 1), part(1, "y", 21, 2), part(1, "y", 21, 2)]):
        answers += release.on_deltas(0, offset, None, deltas)
    answers += release.on_frontier(0, {0: 2})
    rows = [(cols.diff[i], tuple(cols.values[i * 2:(i + 1) * 2])) for _o, _origin, cols in answers
            for i in range(len(cols))]
    assert rows == [(1, (11, 21))]


# Operator queries whose BGP leaves are placed by centre (cbgp.algebra.by_centre): the leaves' parts on the
# routed partitions (stars, single-centre components, multi-centre components by probes, products' parts), the
# operators by the answers service over the leaves' deltas released in seq order.
A = f"<{EX}age>"
OPERATOR_QUERIES = {
    "filter_age": f"SELECT ?x ?a WHERE {{ ?x {A} ?a FILTER(?a > 40) }}",
    "optional_name": f"SELECT ?x ?y ?n WHERE {{ ?x {K} ?y OPTIONAL {{ ?y {N} ?n }} }}",
    "count_likes": f"SELECT ?o (COUNT(*) AS ?n) WHERE {{ ?x {L} ?o }} GROUP BY ?o",
    "count_paths": f"SELECT (COUNT(*) AS ?n) WHERE {{ ?x {K} ?y . ?y {K} ?z }}",
    "union_path3": f"SELECT * WHERE {{ {{ ?a {K} ?b . ?b {K} ?c . ?c {L} ?d }} UNION {{ ?a {T} ?d }} }}",
    "minus_product": f"SELECT ?x ?y WHERE {{ ?x {T} <{EX}Person> . ?y {L} <{EX}Jazz> MINUS {{ ?x {K} ?y }} }}",
    "distinct_unbound": f"SELECT DISTINCT ?x WHERE {{ ?x {K} ?y OPTIONAL {{ ?y {A} ?a }} FILTER(!BOUND(?a)) }}",
    "having": f"SELECT ?x (COUNT(?y) AS ?c) WHERE {{ ?x {K} ?y }} GROUP BY ?x HAVING(COUNT(?y) > 1)",
    # values computed per change, held by the answers service while they are answers
    "sum_concat": f"SELECT ?x (SUM(?a) AS ?s) (GROUP_CONCAT(STR(?a)) AS ?all) WHERE {{ ?x {K} ?y . ?y {A} ?a }} "
                  f"GROUP BY ?x",
    "topk": f"SELECT ?x ?a WHERE {{ ?x {A} ?a }} ORDER BY DESC(?a) ?x LIMIT 2",
    "triangle_filter": f"SELECT ?a ?b ?c WHERE {{ ?a {K} ?b . ?b {K} ?c . ?c {K} ?a FILTER(?a != ?b) }}",
    # a product leaf whose second part has a FILTER pushed into it (behind its gate on the shards)
    "product_filter": f"SELECT ?x ?y ?a WHERE {{ ?x {T} <{EX}Person> . ?y {A} ?a FILTER(?a > 30) }}",
    # a leaf joined by probes with a FILTER on a literal pushed into it (behind its gate in the evaluators)
    "path_filter": f"SELECT ?x ?z ?a WHERE {{ ?x {K} ?y . ?y {K} ?z . ?z {A} ?a FILTER(?a > 30) }}",
}


def test_operator_queries_are_placed_by_centre_unless_a_leaf_cannot_be() -> None:
    from services.wire.registrations import read_query

    for name, text in OPERATOR_QUERIES.items():
        parsed, spec = read_query(text, None)
        assert parsed is None and leaf_parts(spec), name
    _parsed, variable_predicate = read_query(CHAINED_PREDICATES, None)
    assert leaf_parts(variable_predicate) is None


@pytest.mark.parametrize("seed", range(12))
def test_operator_queries_by_centre_equal_one_engine(seed: int) -> None:
    """FILTER, OPTIONAL, aggregates, UNION, MINUS, DISTINCT, HAVING and a top-k over leaves evaluated by centre
    (one leaf a 3-hop path joined by probes, one a product): per update one engine's deltas; odd seeds register
    them halfway; workers and the answers service die now and then."""
    check_seeded_run(generate_patch(300, seed=seed, subjects=6), OPERATOR_QUERIES, seed)


@pytest.mark.parametrize("seed", range(20))
def test_two_owners_during_a_late_operator_registration_answer_once(seed: int, monkeypatch) -> None:
    """The takeover above with operator queries registered during it (a leaf joined by probes, a product
    leaf, an aggregate whose first row is its answer before any change): exact as with one owner, the
    operators' first answers once."""
    queries = {name: OPERATOR_QUERIES[name] for name in ("optional_name", "count_paths", "union_path3",
                                                          "minus_product", "having")}
    check_late_takeover(seed, monkeypatch, queries)


@pytest.mark.parametrize("seed", range(8))
def test_two_owners_during_a_late_registration_of_pattern_leaves_answer_once(seed: int, monkeypatch) -> None:
    """The takeover above with pattern leaves registered during it (a zero-length path, a negated property set,
    variable predicates): each shard's share once."""
    queries = {name: PATH_QUERIES[name] for name in ("star", "star_unanchored", "negated_inverse", "any_predicate")}
    check_late_takeover(seed, monkeypatch, queries)


@pytest.mark.parametrize("seed", range(4))
def test_a_leaf_joined_by_probes_keeps_the_changes_its_pushed_filter_rejects_out_of_the_evaluators(seed) -> None:
    """FILTER push-down into a multi-centre leaf: every routed shard's evaluator stores and probes from only
    the changes the pushed FILTER accepts (its terms read from the dictionary topic, also when the query is
    registered late or a worker restores), and the answers are one engine's."""
    from cbgp.algebra.continuous import FilterGate
    from cbgp.algebra.expressions import Terms
    from cbgp.distributed.evaluator import PartitionEvaluator
    from cbgp.distributed.program import compile_component
    from services.wire.registrations import read_query
    from services.worker.shard_engine import ShardDictionary

    _parsed, spec = read_query(OPERATOR_QUERIES["path_filter"], None)
    (part,) = leaf_parts(spec)
    assert part.plan.probed and list(part.pushed.pushed) == [2]
    dictionary = ShardDictionary()
    program = compile_component("q", part.plan, dictionary)
    gated, plain = PartitionEvaluator(0, 1), PartitionEvaluator(0, 1)
    gated.register(program, -1, -1, FilterGate.of([part.pushed], dictionary, Terms(dictionary, part.prologue)))
    plain.register(program, -1, -1)
    age = dictionary.encode(A)
    for n in range(20, 60):
        s = dictionary.encode(f"<{EX}p{n}>")
        o = dictionary.encode(f'"{n}"^^<http://www.w3.org/2001/XMLSchema#integer>')
        for evaluator in (gated, plain):
            evaluator.apply(n, 1, s, age, o, 0, 3)
    assert gated.queries["q"].gated == 11 and gated.state_entries() < plain.state_entries()
    # In the fleet (late registration for odd seeds, worker crashes, checkpoints), exact and gated:
    rng = random.Random(seed)
    queries = {"path_filter": OPERATOR_QUERIES["path_filter"]}
    lines = generate_patch(300, seed=seed, subjects=6)
    stats: dict = {}
    registered: dict = {}
    got = run_distributed(lines, queries, 2 + seed % 3, 1, rng, late=set(queries) if seed % 2 else set(),
                          worker_crash_rate=0.05, registered=registered, checkpoint_rate=0.3, stats=stats)
    assert_exact(got, run_whole(lines, queries), queries, registered["seq"] if seed % 2 else None)
    assert stats["gated_in_evaluators"] > 0


def test_a_leaf_with_a_pushed_filter_keeps_the_changes_it_rejects_out_of_the_shard_state() -> None:
    """FILTER push-down by centre: a leaf's pattern with a pushed FILTER is evaluated behind the filter's gate
    on the shard (``GatedLeafPart``), so rejected changes cost no state there; the rows it reports are the
    plain leaf's that the filter keeps (the filter runs again with the operators)."""
    from services.wire.registrations import read_query
    from services.worker.shard_engine import ShardDictionary, WorkerEngine

    _parsed, spec = read_query(OPERATOR_QUERIES["filter_age"], None)
    (part,) = leaf_parts(spec)
    assert part.pushed is not None and part.part == -1
    dictionary = ShardDictionary()
    gated, plain = WorkerEngine(dictionary), WorkerEngine(dictionary)
    gated.register("leaf", part)
    plain.register("leaf", part.plan)
    got, everything = Counter(), Counter()
    age = dictionary.encode(A)
    for n in range(20, 60):
        s = dictionary.encode(f"<{EX}p{n}>")
        o = dictionary.encode(f'"{n}"^^<http://www.w3.org/2001/XMLSchema#integer>')
        got.update((sign, row) for _name, sign, row in gated.apply(1, s, age, o, 0))
        everything.update((sign, row) for _name, sign, row in plain.apply(1, s, age, o, 0))
    at = plain.columns("leaf").index("a")
    assert gated.columns("leaf") == plain.columns("leaf")
    kept = Counter({(sign, row): k for (sign, row), k in everything.items()
                    if int(dictionary.decode(row[at]).split('"')[1]) > 40})
    assert got == kept and len(kept) == 19
    assert gated.state_entries() * 2 < plain.state_entries()
    assert gated.operators["leaf"].gated == 21
    # A product leaf: the filter goes with the part that holds its pattern.
    _parsed, product = read_query(OPERATOR_QUERIES["product_filter"], None)
    person, aged = leaf_parts(product)
    assert (person.part, aged.part) == (0, 1) and person.pushed is None
    assert aged.pushed is not None and list(aged.pushed.pushed) == [0]
    assert aged.pushed.query.patterns == aged.plan.query.patterns


def test_a_plan_carrying_its_change_seq_spares_the_worker_reading_the_log_next_to_it() -> None:
    """The registry writes ``registered_at_change_seq``: a worker takes it as the seq the registration answers as of
    and reads nothing of updates.encoded for it (an older plan, without it, is looked up there)."""
    reads: list[tuple] = []

    def reader(kind, partition, start, end):
        reads.append((kind, start, end))
        return []

    core = WorkerCore({"deltas.parts": "d", "deadletter": "x"}, 4, 1, 4, reader, assemble_in_spark=False)
    plan = {"query_id": "q", "sparql": f"SELECT ?x WHERE {{ ?x <{EX}p> ?y }}", "options": {}, "plan_json": "{}",
            "projected": [], "registered_at_seq": 50, "version": 1, "registered_at_change_seq": 7}
    core.on_plan(0, 0, b"q", codec.encode("QueryPlan", plan), [])
    assert core.registration_seq(core.plans["q"]) == 7 and reads == []
    older = {key: value for key, value in plan.items() if key != "registered_at_change_seq"}
    core.on_plan(0, 1, b"q", codec.encode("QueryPlan", {**older, "version": 2}), [])
    assert core.registration_seq(core.plans["q"]) == 0 and reads  # (read in the log: here, no change there)


# Property paths: a sequence, an alternative and an inverse are BGPs, unions and DISTINCT over leaves placed by
# centre; a `+` closure runs in the answers service over its step's leaf (by centre); a negated property set is
# evaluated where its subject lives, a zero-length path (`*`, `?`) counts each node where the node lives.
PATH_QUERIES = {
    "reach": f"SELECT * WHERE {{ <{EX}s0> {K}+ ?y }}",
    "reached": f"SELECT * WHERE {{ ?x ({K}|{L})+ <{EX}s1> }}",
    "closure": f"SELECT ?x ?y WHERE {{ ?x {K}+ ?y }}",
    "closure_joined": f"SELECT * WHERE {{ ?x {K}+ ?y . ?y {T} ?t }}",
    "sequence": f"SELECT * WHERE {{ ?x {K}/{K}/{L} ?y }}",
    "alternative": f"SELECT * WHERE {{ ?x {K}|^{L} ?y }}",
    "star": f"SELECT * WHERE {{ <{EX}s2> {K}* ?y }}",
    "star_reached": f"SELECT * WHERE {{ ?x {K}* <{EX}s1> }}",
    "star_unanchored": f"SELECT * WHERE {{ ?x ({K}|{L})* ?y }}",
    "optional_step": f"SELECT * WHERE {{ ?x {K}? ?y . ?y {T} ?t }}",
    "negated": f"SELECT * WHERE {{ ?x !({K}|{T}) ?y }}",
    "negated_inverse": f"SELECT * WHERE {{ ?x ^!{K} <{EX}s1> }}",
    "negated_plus": f"SELECT * WHERE {{ <{EX}s0> !{T}+ ?y }}",
    # variable predicates: a star of them (one subject) and a pair sharing its object
    "any_predicate": f"SELECT * WHERE {{ ?x ?p ?y . ?x {T} ?t }}",
    "same_object": "SELECT * WHERE { ?x ?p ?z . ?y ?q ?z FILTER(?x != ?y) }",
}
# Patterns with a variable predicate that share no end: a change can only meet its partners on one owner.
CHAINED_PREDICATES = "SELECT * WHERE { ?x ?p ?y . ?y ?q ?z }"


def test_path_queries_are_placed_by_centre_unless_their_patterns_share_no_end() -> None:
    from cbgp.algebra import analyse
    from services.registry.core import operator_placement

    for name, text in PATH_QUERIES.items():
        assert operator_placement(analyse(text)) == BY_CENTRE, name
    assert operator_placement(analyse(CHAINED_PREDICATES)) == SINGLE_OWNER


@pytest.mark.parametrize("seed", range(18))
def test_path_queries_in_the_fleet_equal_one_engine(seed: int) -> None:
    """Property paths placed by centre over 1-4 routed partitions, registered before the stream or halfway, with
    workers and the answers service crashing and restoring from checkpoints: per update one engine's deltas.
    A third of the queries per seed: the simulation checkpoints the answers state after most records."""
    names = sorted(PATH_QUERIES)[seed % 3::3]
    check_seeded_run(generate_patch(300, seed=seed, subjects=6), {name: PATH_QUERIES[name] for name in names}, seed)


@pytest.mark.parametrize("seed", range(24))
def test_a_registration_read_long_after_its_point_waits_for_the_probes_of_the_records_replayed(seed: int) -> None:
    """Multi-centre queries registered near the start of the stream, their plans read by every worker only
    near its end: each worker has sent frontiers far past the registration's point, then replays its log from
    there for the new queries.  The probes of those replayed records are answered after the frontiers that
    cover them, so a partition marks the registration ready only once they are done; the answers service
    releases none of them early, and drops none as a repeat (an example client once saw one answer of an
    INSERT and never the other)."""
    rng = random.Random(seed)
    lines = generate_patch(240, seed=seed, subjects=5)
    queries = {name: BY_CENTRE_QUERIES[name] for name in ("path", "triangle", "product")}
    registered: dict = {}
    got = run_distributed(lines, queries, 2 + seed % 3, 1 + seed % 2, rng, late=set(queries), registered=registered,
                          late_point=0.1 * (seed % 3), late_read=0.9)
    assert_late_answers(got, run_whole(lines, queries), queries, registered["seq"])


def test_a_gate_opens_without_parsing_a_query_its_plan_names_a_bgp() -> None:
    """The answers service reads a registration's text only for an operator query (or a product's parts) when its
    gate opens: the first parse in a process costs a third of a second, which a star's first answers waited for."""
    read: list[str] = []
    classes = {"star": "simple var-centric star", "filtered": "operators"}
    texts = {"star": f"SELECT * WHERE {{ ?x {K} ?y }}", "filtered": f"SELECT * WHERE {{ ?x {K} ?y FILTER(?y != ?x) }}"}

    def text_of(query_id: str, _version: int) -> str:
        read.append(query_id)
        return texts[query_id]

    release = SeqRelease(1, text_of, {11: f"<{EX}a>", 21: f"<{EX}b>"}, lambda query_id, _v: classes[query_id])
    release.restore(0, None)
    answers = []
    for offset, query_id in enumerate(classes):
        part = 0 if classes[query_id] == "operators" else -1  # (an operator query's leaves are its parts)
        deltas = PartDeltaColumns(query_id, part, ["x", "y"], [1], [1], [11, 21], [0], [0], [0], [True], [None], 1,
                                  False, True, False)
        answers += release.on_deltas(0, offset, None, deltas)
        answers += release.on_ready(0, 10 + offset, query_id, 1, 0, 1)
    answers += release.on_frontier(0, {0: 1})
    assert sorted(cols.query_id for _o, _origin, cols in answers) == ["filtered", "star"]
    assert read == ["filtered"]
