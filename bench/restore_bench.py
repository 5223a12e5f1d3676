"""Restore time after short and long histories over the same final state: ingest, and the workers'
shards and the answers service's partitions in memory.

Ingest's state (presence set, seq, published terms) is restored on the embedded broker after a history of
20,000 and of 200,000 updates that end in the same graph: the first distinct LSBench triples are inserted (the
final state), then the rest of the history deletes and re-inserts them (churn that leaves the graph and the
dictionary as they were).  Each history is written to fresh topics as ingest writes it (the Kafka-free
``IngestProcessor`` over raw records of 1,000 lines, its updates.encoded and dictionary outputs produced), and
its checkpoint is saved where a running ingest would have made its last one: before the last 2,000 updates
(the same tail for both histories).  Then the restore (``services.ingest.service.restore``: open the store, load the
checkpoint, read the logs from its positions, or everything from offset 0 without one) is timed, median of
three runs, and checked against the processor's final state.  The restore rate (state entries, triples plus
terms, per second of the checkpoint restore) is measured on a larger state: ``--rate-triples`` (100,000) triples
and their terms, restored the same way with the same tail, where fixed costs (topic metadata, consumers) weigh
less than in the 15,000-triple cases.

The workers' shards (``--worker``, on by default) are restored in memory, without a broker: the same histories
go through ``IngestProcessor`` into routed and encoded logs, a ``WorkerCore`` holding the LSBench bench queries
(``bench/queries``: stars, and multi-centre paths and snowflakes joined by probes, whose probes it appends to the
routed logs) and two friend-of-friend queries (plain and DISTINCT, which answer a lot over these triples) applies
them over 4 routed partitions, checkpoints every shard into a RocksDB store before the last
``--tail`` updates and applies the rest; then every shard is opened again at its committed offset, from the
checkpoint and from offset 0 (what a restarted worker does), timed, and the restored states are checked equal
(``tests/services/worker/test_worker_checkpoint.py`` checks the outputs after such restores byte for byte).  The
broker's fetch of the logs' tails is not in these figures (ingest's restore above has it); a third case,
"from Kafka", writes the same checkpoint to the embedded broker's checkpoint topics and restores with no
checkpoint on disk, so it reads them back first (what a worker that takes over a partition does).

The answers service's partitions likewise: the worker's deltas.parts records go through the release and the
answers core over 4 partitions, each checkpointed (``services.answers.checkpoint``) where the worker's
checkpoint was taken; then every partition is restored from its checkpoint plus the answers and deltas after it,
and from offset 0, timed, and the restored answer streams checked equal to the live ones.

One line per case, then one JSON line in the restore figures' format ("worker", "answers": from the checkpoint, in memory;
"ingest_from_offset_0" / "worker_from_offset_0" / "answers_from_offset_0": the same without a checkpoint;
"worker_from_kafka_checkpoint" / "ingest_from_kafka_snapshot": from the checkpoint read back from Kafka, with
none on disk):

    .venv/bin/python bench/restore_bench.py [--data DIR] [--state-triples N] [--rate-triples N] [--tail N] [--runs N]
"""

from __future__ import annotations

import os
import secrets
import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("CBGP_CHECKPOINT_SECRET", secrets.token_hex(32))  # (services that checkpoint need one)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lsbench import DEFAULT_DATA, build_updates, load_or_generate  # noqa: E402

from services.ingest.service import KIND as INGEST_KIND  # noqa: E402
from services.ingest.core import IngestProcessor, RawRecord
from services.ingest.service import restore, save_checkpoint  # noqa: E402
from services.kafka.checkpoint_log import CheckpointLog  # noqa: E402
from services.runtime.life import commit_transaction  # noqa: E402
from services.kafka.broker import EmbeddedBroker
from services.kafka.config import KafkaSettings
from services.kafka.topics import ensure_topics
from services.kafka.client import make_producer  # noqa: E402
from services.state.store import Store
from services.state import presence  # noqa: E402

HISTORIES = (20_000, 200_000)
LINES_PER_RECORD = 1000


def history(final: list[str], length: int) -> list[str]:
    """RDF Patch lines: insert every triple of ``final``, then delete and re-insert them in turn up to ``length``
    updates (the graph, and so the dictionary, end as after the inserts)."""
    lines = [f"A {t} ." for t in final]
    i = 0
    while len(lines) + 2 <= length:
        triple = final[i % len(final)]
        lines += [f"D {triple} .", f"A {triple} ."]
        i += 1
    return lines


def write_history(settings: KafkaSettings, lines: list[str], tail: int, store: Store,
                  remote: CheckpointLog | None = None) -> IngestProcessor:
    """Run ``lines`` through an ingest processor, produce its encoded and dictionary records, and checkpoint its
    state into ``store`` (and, with ``remote``, as ingest's snapshot in Kafka) before the last ``tail`` updates;
    returns the processor (the state to restore)."""
    processor = IngestProcessor(settings, settings.partitions, settings.partitions)
    processor.track_changes = True
    wanted = {processor.t_encoded, processor.t_dictionary}
    counts: dict[str, dict[int, int]] = {processor.t_encoded: {0: 0},
                                         processor.t_dictionary: {p: 0 for p in range(settings.partitions)}}
    producer = make_producer(settings, linger_ms=20)
    cut = len(lines) - tail
    for start in range(0, len(lines), LINES_PER_RECORD):
        if start == cut - cut % LINES_PER_RECORD:
            assert producer.flush(60) == 0
            saved = save_checkpoint(processor, store, {t: dict(parts) for t, parts in counts.items()})
            if remote is not None:
                terms = [(i, processor.dictionary.decode(i)) for i in processor.published]
                remote.queue([(INGEST_KIND, 0, presence.snapshot(processor.present, terms, saved.to_json()),
                               counts[processor.t_encoded][0])])
                commit_transaction(make_producer(settings, transactional_id=f"{settings.topic_prefix}snap"),
                                   remote.take(), [])
        text = ("\n".join(lines[start:start + LINES_PER_RECORD]) + "\n").encode()
        raw = RawRecord(text, {}, settings.topic("updates.raw"), 0, start // LINES_PER_RECORD, 1_700_000_000_000)
        for out in processor.process(raw):
            if out.topic in wanted:
                producer.produce(out.topic, out.value, out.key, partition=out.partition)
                counts[out.topic][out.partition or 0] += 1
                producer.poll(0)
    assert producer.flush(60) == 0
    return processor


def timed_restore(settings: KafkaSettings, store_path: Path | None, expected: IngestProcessor,
                  remote: CheckpointLog | None = None) -> float:
    started = time.perf_counter()
    store = Store(store_path) if store_path is not None else None
    try:
        processor = IngestProcessor(settings, settings.partitions, settings.partitions)
        restore(processor, settings, store, remote)
    finally:
        if store is not None:
            store.close()
    seconds = time.perf_counter() - started
    assert processor.present == expected.present and processor.seq == expected.seq, "restored state differs"
    assert processor.published == expected.published, "restored terms differ"
    return seconds


WORKER_PARTITIONS = 4
# The bench queries answer little over the first (static) LSBench triples; these answer a lot there, so that
# the answers log and the release's DISTINCT counts grow with history as in a real run.
KNOWS = "<http://xmlns.com/foaf/0.1/knows>"
SIB = "http://www.ins.cwi.nl/sib/vocabulary/"
LATE = (f"SELECT * WHERE {{ ?post <http://www.w3.org/1999/02/22-rdf-syntax-ns#type> <{SIB}Post> . "
        f"?post <{SIB}hashtag> ?tag }}")  # a star registered after the checkpoint (``registered_after``)
# ... and a whole query (variable predicates in patterns that share no end, under a FILTER: its single owner
# evaluates it on updates.encoded)
LATE_WHOLE = f"SELECT ?post ?p WHERE {{ ?post ?p ?tag . ?tag ?q ?about FILTER(?p = <{SIB}hashtag>) }}"
ANSWERING = {"friends_of_friends": f"SELECT * WHERE {{ ?a {KNOWS} ?b . ?b {KNOWS} ?c }}",
             "distinct_fof": f"SELECT DISTINCT ?a ?c WHERE {{ ?a {KNOWS} ?b . ?b {KNOWS} ?c }}"}


def worker_restores(lines: list[str], tail: int, runs: int, made: dict | None = None,
                    kafka: KafkaSettings | None = None, registered_after: bool = False) -> dict[str, float]:
    """Seconds (median of ``runs``) to open every shard of a worker at its committed offset after ``lines``, from
    the checkpoint taken ``tail`` updates before the end and from offset 0 (see the module docstring); with
    ``kafka``, also from the same checkpoint written to and read back from its checkpoint topics
    (``"kafka"``: what a worker without the checkpoint on its disk does).
    ``made``: filled with what the answers service reads (``deltas``: deltas.parts records per partition,
    ``cut``: how many each had at the checkpoint, ``terms``, ``queries``).  ``registered_after``: two more queries
    (``LATE``, a star, and ``LATE_WHOLE``, a whole query) are registered after the checkpoint, so the checkpoints
    lack them: the restore adopts them and catches those queries up (before, it replayed every shard holding them
    from offset 0), from the logs below the checkpoint or (case ``base``) from ingest's snapshot moved there."""
    from services import codec
    from services.kafka.checkpoint_log import CheckpointLog
    from services.runtime.life import commit_transaction
    from services.state.shards import ShardCheckpoints
    from services.worker.core import WorkerCore
    from services.worker.shard import decode_changes
    from services.worker.snapshots import IngestSnapshot

    n = WORKER_PARTITIONS
    queries = {p.stem: p.read_text() for p in sorted((Path(__file__).parent / "queries").glob("*.rq"))}
    queries.update(ANSWERING)
    settings = KafkaSettings(topic_prefix="m.")
    ingest = IngestProcessor(settings, n, n)
    logs: dict[tuple[str, int], list[bytes]] = {("whole", 0): [], **{("routed", p): [] for p in range(n)}}
    cut = {}
    base = None  # ingest's snapshot at the checkpoint: presence with insert seqs, routed ends, encoded offset, seq
    for start in range(0, len(lines), LINES_PER_RECORD):
        if start == (len(lines) - tail) - (len(lines) - tail) % LINES_PER_RECORD:
            cut = {key: len(log) for key, log in logs.items()}
            base = IngestSnapshot(dict(ingest.present), {p: cut[("routed", p)] for p in range(n)},
                                  cut[("whole", 0)], ingest.seq)
        raw = RawRecord(("\n".join(lines[start:start + LINES_PER_RECORD]) + "\n").encode())
        for out in ingest.process(raw):
            if out.topic == "m.dictionary" and made is not None:
                made.setdefault("terms", {}).update(codec.dictionary_entries(out.value))
            if out.topic in ("m.updates.routed", "m.updates.encoded"):
                kind = "routed" if out.topic == "m.updates.routed" else "whole"
                logs[(kind, out.partition if kind == "routed" else 0)].append(out.value)
    shards = [("routed", p) for p in range(n)] + [("whole", p) for p in range(n)]

    def core(checkpoints: ShardCheckpoints | None, late: bool = registered_after, based: bool = False) -> WorkerCore:
        made = WorkerCore({"deltas.parts": "m.deltas.parts", "deadletter": "m.deadletter",
                           "updates.routed": "m.updates.routed"}, n, n, n,
                          lambda kind, p, start, end: [c for v in logs[(kind, p if kind == "routed" else 0)][start:end]
                                                       for c in decode_changes(kind, v)],
                          assemble_in_spark=False, checkpoints=checkpoints,
                          record_reader=lambda p, start, end: list(enumerate(logs[("routed", p)][start:end], start)),
                          base_source=(lambda: base) if based else None)
        for i, (name, text) in enumerate(sorted(queries.items())):
            plan = {"query_id": name, "sparql": text, "options": {}, "plan_json": "{}", "projected": [],
                    "registered_at_seq": 0, "version": 1}
            made.on_plan(i % n, i, name.encode(), codec.encode("QueryPlan", plan), range(n))
        if late:
            register_late(made)
        return made

    def register_late(worker: WorkerCore) -> None:
        for i, (name, text) in enumerate((("late", LATE), ("late_whole", LATE_WHOLE))):
            plan = {"query_id": name, "sparql": text, "options": {}, "plan_json": "{}", "projected": [],
                    "registered_at_seq": cut[("whole", 0)], "version": 1}
            worker.on_plan(0, len(queries) + i, name.encode(), codec.encode("QueryPlan", plan), range(n))

    def apply(worker: WorkerCore, upto: dict[tuple[str, int], int] | None) -> None:
        """Every shard's log up to ``upto`` (None: to its end, and again while probes keep coming); the probes
        the worker writes to routed partitions are appended to their logs (it holds them all)."""
        while True:
            out = []
            for kind, p in shards:
                source = (kind, p if kind == "routed" else 0)
                shard, log = worker.shards[(kind, p)], logs[source]
                for offset in range(shard.position, len(log) if upto is None else upto[source]):
                    out += (worker.on_routed(shard, offset, log[offset], None)[0] if kind == "routed"
                            else worker.on_record(shard, offset, decode_changes(kind, log[offset])))
            out += worker.flush_batches()
            probes = [o for o in out if o.topic == "m.updates.routed"]
            for o in probes:
                logs[("routed", o.partition)].append(o.value)
            if worker is live:
                for o in out:
                    if o.topic == "m.deltas.parts":
                        deltas[o.partition].append(o.value)
            if upto is not None or not probes:
                return

    deltas: dict[int, list[bytes]] = {p: [] for p in range(n)}
    live = None
    with tempfile.TemporaryDirectory(prefix="worker-restore-") as tmp, Store(Path(tmp) / "w") as store:
        checkpoints = ShardCheckpoints(store)
        live = core(checkpoints, late=False)
        for key in shards:
            live.open_shard(*key, 0, None)
        apply(live, cut)
        blobs = live.checkpoint_blobs(shards)
        checkpoints.put(blobs)
        if registered_after:
            register_late(live)
        cases: list[tuple[str, ShardCheckpoints | None]] = [("checkpoint", checkpoints), ("offset0", None)]
        if registered_after:  # the catch-up from ingest's snapshot at the checkpoint, not the log from 0
            cases.append(("base", checkpoints))
        if kafka is not None:
            remote = CheckpointLog(kafka, {"routed": kafka.topic("checkpoints.routed"),
                                           "whole": kafka.topic("checkpoints.whole")}, "bench")
            remote.queue(blobs)
            commit_transaction(make_producer(kafka, transactional_id=f"{kafka.topic_prefix}bench"), remote.take(), [])
            cases.append(("kafka", ShardCheckpoints(None, remote)))
            print(f"worker checkpoint in Kafka: {sum(len(blob) for _k, _p, blob, *_o in blobs) / 1e6:.1f} MB in "
                  f"{len(blobs)} shards", flush=True)
        if made is not None:
            made.update(deltas=deltas, cut={p: len(records) for p, records in deltas.items()}, queries=queries)
        apply(live, None)
        committed, metadata = {key: shard.position for key, shard in live.shards.items()}, live.metadata()
        times: dict[str, list[float]] = {case: [] for case, _source in cases}
        follow = {}
        for _ in range(runs):
            for case, source in cases:
                worker = core(source, based=case == "base")
                started = time.perf_counter()
                for key in shards:
                    worker.open_shard(*key, committed[key], metadata)
                times[case].append(time.perf_counter() - started)
                follow[case] = worker
        # (tests/services/worker/test_worker_checkpoint.py checks the outputs after such restores byte for byte)
        for case in follow:
            assert {k: s.state_entries() for k, s in follow[case].shards.items()} == \
                {k: s.state_entries() for k, s in follow["offset0"].shards.items()}, f"restored states differ ({case})"
    return {case: statistics.median(values) for case, values in times.items()}


def answers_restores(made: dict, runs: int) -> dict[str, float]:
    """Seconds (median of ``runs``) to restore every deltas.parts partition of the answers service after the
    records ``made`` holds, from its checkpoint taken at ``made["cut"]`` (``services.answers.checkpoint``) and from
    offset 0, in memory; the restored states are checked equal."""
    from services import codec
    from services.answers.core import AnswersCore
    from services.answers.checkpoint import adopt, partition_blob
    from services.answers.release import SeqRelease
    from services.state.shards import load_shard

    deltas, terms, queries = made["deltas"], made["terms"], made["queries"]

    def fresh() -> tuple[SeqRelease, AnswersCore]:
        return (SeqRelease(len(deltas), lambda query_id, _version: queries.get(query_id), dict(terms)),
                AnswersCore("m.answers", "m.answers.current", "m.deadletter", "m.deltas.parts"))

    live: dict[int, tuple] = {}  # partition -> (answers log, committed, checkpoint blob)
    for d, records in deltas.items():
        release, core = fresh()
        release.restore(d, None)
        answers: list = []
        blob = None
        for offset, value in enumerate(records):
            ready = release.on_record(d, offset, value)
            for source_offset, origin, columns in ready:
                answers += [o for o in core.on_record(d, source_offset, value, origin, terms.get, columns)
                            if o.topic == "m.answers"]
            if offset + 1 == made["cut"][d]:
                blob = partition_blob(core, release, d, *release.commit_position(d, offset + 1), len(answers),
                                      answers[-1].value if answers else None)
        live[d] = (answers, release.commit_position(d, len(records)), blob, core)

    def restore(d: int, use_checkpoint: bool) -> AnswersCore:
        answers, (position, metadata), blob, _core = live[d]
        release, core = fresh()
        saved = load_shard(blob) if use_checkpoint and blob is not None else None
        if saved is not None:
            adopt(core, d, saved)
        for out in answers[saved["answers_end"] if saved else 0:]:
            core.restore(d, out.value, dict(out.headers or ()))
        end = release.restore(d, metadata, saved=saved["release"] if saved else None)
        for offset in range(saved["position"] if saved else 0, end):
            value = deltas[d][offset]
            if codec.frontier_of(value) is None and codec.probe_ready_of(value) is None:
                release.restore_counts(d, offset, codec.part_delta_columns(value))
        return core

    times: dict[str, list[float]] = {"checkpoint": [], "offset0": []}
    for _ in range(runs):
        for case in ("checkpoint", "offset0"):
            started = time.perf_counter()
            cores = {d: restore(d, case == "checkpoint") for d in deltas}
            times[case].append(time.perf_counter() - started)
            for d, core in cores.items():
                want = live[d][3]
                assert {q: (s.n, s.current) for q, s in core.queries.items()} == \
                    {q: (s.n, s.current) for q, s in want.queries.items()}, "restored answers differ"
    return {case: statistics.median(values) for case, values in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LSBench files (default: the shared "
                        "lsbench-1000; the generator stands in when absent)")
    parser.add_argument("--state-triples", type=int, default=15_000, help="triples in the final state (default 15000)")
    parser.add_argument("--rate-triples", type=int, default=100_000,
                        help="triples in the state the restore rate is measured on (default 100000)")
    parser.add_argument("--tail", type=int, default=2_000, help="updates after the checkpoint (default 2000)")
    parser.add_argument("--runs", type=int, default=3, help="restores timed per case; the median is reported")
    parser.add_argument("--worker", action=argparse.BooleanOptionalAction, default=True,
                        help="also the workers' shards, in memory (default on)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    stream = build_updates(load_or_generate(args.data))
    inserted = [f"{s} {p} {o}" for sign, s, p, o in stream.updates if sign > 0]
    final = inserted[:args.state_triples]
    results: dict[str, dict[str, float]] = {"checkpoint": {}, "offset0": {}, "kafka": {}}
    cases = [(length, final, ("checkpoint", "offset0", "kafka")) for length in HISTORIES]
    cases.append((args.rate_triples + args.tail, inserted[:args.rate_triples], ("checkpoint",)))
    entries_per_s = 0.0
    how = {"checkpoint": "checkpoint+tail", "offset0": "offset 0", "kafka": "snapshot read from Kafka+tail"}
    with tempfile.TemporaryDirectory(prefix="restore-bench-") as tmp, EmbeddedBroker(Path(tmp) / "broker") as broker:
        for number, (length, state, kinds) in enumerate(cases):
            settings = broker.settings(topic_prefix=f"rb{uuid.uuid4().hex[:8]}.", partitions=4)
            ensure_topics(settings)
            store_path = Path(tmp) / f"state-{number}"
            remote = (CheckpointLog(settings, {INGEST_KIND: settings.topic("checkpoints.ingest")}, "bench")
                      if "kafka" in kinds else None)
            with Store(store_path) as store:
                expected = write_history(settings, history(state, length), args.tail, store, remote)
            entries = len(expected.present) + len(expected.published)
            for case in kinds:
                path = store_path if case == "checkpoint" else None
                seconds = statistics.median(timed_restore(settings, path, expected,
                                                          remote if case == "kafka" else None)
                                            for _ in range(args.runs))
                rate = number == len(cases) - 1
                if rate:
                    entries_per_s = entries / seconds
                else:
                    results[case][str(length)] = round(seconds, 3)
                print(f"ingest history={length} restore={how[case]} "
                      f"seconds={seconds:.3f} state_triples={len(expected.present)} terms={len(expected.published)} "
                      f"seq={expected.seq} tail_updates={length if case == 'offset0' else args.tail}"
                      + (f" entries_per_s={entries_per_s:.0f}" if rate else "") + f" source={stream.source}", flush=True)
    workers: dict[str, dict[str, float]] = {"checkpoint": {}, "offset0": {}, "kafka": {}}
    answers: dict[str, dict[str, float]] = {"checkpoint": {}, "offset0": {}}
    after: dict[str, float] = {}  # a query registered after the checkpoint
    if args.worker:
        with tempfile.TemporaryDirectory(prefix="restore-bench-") as tmp, \
                EmbeddedBroker(Path(tmp) / "broker") as broker:
            for length in HISTORIES:
                made: dict = {}
                kafka = broker.settings(topic_prefix=f"rw{uuid.uuid4().hex[:8]}.", partitions=WORKER_PARTITIONS)
                ensure_topics(kafka)
                for case, seconds in worker_restores(history(final, length), args.tail, args.runs, made,
                                                     kafka).items():
                    workers[case][str(length)] = round(seconds, 3)
                    how = {"checkpoint": "checkpoint+tail", "offset0": "offset 0",
                           "kafka": "checkpoint read from Kafka+tail"}[case]
                    print(f"worker history={length} restore={how} seconds={seconds:.3f} shards={2 * WORKER_PARTITIONS} "
                          f"(logs in memory) source={stream.source}", flush=True)
                for case, seconds in answers_restores(made, args.runs).items():
                    answers[case][str(length)] = round(seconds, 3)
                    how = "checkpoint+tail" if case == "checkpoint" else "offset 0"
                    print(f"answers history={length} restore={how} seconds={seconds:.3f} partitions={WORKER_PARTITIONS} "
                          "(in memory) "
                          f"deltas_records={sum(map(len, made['deltas'].values()))} source={stream.source}", flush=True)
            # One more query registered after the checkpoint: adopted and caught up, or (before) from offset 0.
            length = HISTORIES[-1]
            for case, seconds in worker_restores(history(final, length), args.tail, args.runs,
                                                 registered_after=True).items():
                after[case] = round(seconds, 3)
                how = {"checkpoint": "checkpoint+tail+catch-up", "offset0": "offset 0",
                       "base": "checkpoint+tail+catch-up from ingest's snapshot"}[case]
                print(f"worker history={length} restore={how} seconds={seconds:.3f} shards={2 * WORKER_PARTITIONS} "
                      f"(a star and a whole query registered after the checkpoint; logs in memory) "
                      f"source={stream.source}", flush=True)
    print(json.dumps({"worker": workers["checkpoint"] or None, "ingest": results["checkpoint"],
                      "answers": answers["checkpoint"] or None, "restore_entries_per_s": round(entries_per_s),
                      "ingest_from_offset_0": results["offset0"], "worker_from_offset_0": workers["offset0"] or None,
                      "answers_from_offset_0": answers["offset0"] or None,
                      "worker_from_kafka_checkpoint": workers["kafka"] or None,
                      "ingest_from_kafka_snapshot": results["kafka"],
                      "worker_after_registration": after or None}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
