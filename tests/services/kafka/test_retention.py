"""Retention is explicit: every catalogue topic sets ``retention.ms`` for its role, the broker
stores it, and ``cbgp topics floor`` says per partition the lowest offset the fleet still needs."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from services.commands.main import main
from services.kafka.client import end_offsets, make_consumer, make_producer
from services.kafka.config import KafkaSettings
from services.commands.floor import floor
from services.kafka.topics import KEPT, TOPICS, WEEK_MS, spec

REPLAYED: set[str] = set()  # a restore reads it from offset 0 (none left)
# a restore reads them from its checkpoint's position (or from ingest's snapshot's)
CHECKPOINTED = {"deltas.parts", "updates.routed", "updates.encoded"}
CHECKPOINTS = {"checkpoints.ingest", "checkpoints.routed", "checkpoints.whole", "checkpoints.deltas"}  # trimmed by their writers
COMPACTED = {"dictionary", "queries.plans", "answers.current"}
BOUNDED = {"updates.raw", "admin", "queries.status", "deadletter", "answers"}


def test_every_topic_has_an_explicit_retention_chosen_for_its_role_and_documented() -> None:
    assert {t.name for t in TOPICS} == REPLAYED | CHECKPOINTED | CHECKPOINTS | COMPACTED | BOUNDED
    for t in TOPICS:
        configs = t.topic_configs()
        assert "retention.ms" in configs and "cleanup.policy" in configs, t.name
        if t.name in REPLAYED:  # never deleted by age nor by size
            assert configs == {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}, t.name
            assert "retention.ms=-1, retention.bytes=-1" in t.doc, t.name
        elif t.name in CHECKPOINTS:  # never deleted by age nor by size: the writer deletes its older checkpoints
            assert configs == {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}, t.name
            assert "delete_records" in t.doc, t.name
        elif t.name in CHECKPOINTED:  # kept by default; may be bounded: the restore starts at the checkpoint
            assert configs == {"cleanup.policy": "delete", "retention.ms": "-1"}, t.name
            assert "checkpoint" in t.doc, t.name
        elif t.name in COMPACTED:
            assert configs["cleanup.policy"] == "compact" and configs["retention.ms"] == str(KEPT), t.name
            assert configs["retention.bytes"] == "-1" and "Compacted" in t.doc, t.name
        else:
            assert configs == {"cleanup.policy": "delete", "retention.ms": str(WEEK_MS)}, t.name
            assert "7 days" in t.doc, t.name
        assert t.restored_from == (t.name in REPLAYED | CHECKPOINTED | COMPACTED | {"answers"}), t.name


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_broker_stores_the_catalogue_retention(kafka_settings: KafkaSettings) -> None:
    admin = AdminClient(kafka_settings.admin_config())
    resources = [ConfigResource(ConfigResource.Type.TOPIC, kafka_settings.topic(t.name)) for t in TOPICS]
    described = {r.name: f.result(10) for r, f in admin.describe_configs(resources, request_timeout=10).items()}
    for t in TOPICS:
        got = described[kafka_settings.topic(t.name)]
        assert {k: got[k].value for k in t.topic_configs()} == t.topic_configs(), t.name


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_floor_is_zero_for_replayed_and_compacted_logs_the_group_position_for_inputs_and_the_end_otherwise(
        kafka_settings: KafkaSettings, capsys: pytest.CaptureFixture[str]) -> None:
    s = kafka_settings
    producer = make_producer(s)
    for topic, count in (("updates.raw", 5), ("admin", 2), ("deadletter", 2), ("queries.status", 1),
                         ("updates.encoded", 3)):
        for i in range(count):
            producer.produce(s.topic(topic), value=f"{topic}{i}".encode())
    assert producer.flush(10) == 0
    ingest = make_consumer(s, f"{s.topic_prefix}ingest")
    try:  # ingest has committed its first 3 raw records; the registry has committed nothing yet
        ingest.commit(offsets=[TopicPartition(s.topic("updates.raw"), 0, 3)], asynchronous=False)
    finally:
        ingest.close()

    expected = {s.topic(t.name): {str(p): 0 for p in range(t.partitions_for(s))} for t in TOPICS}
    expected[s.topic("updates.raw")] = {"0": 3}
    expected[s.topic("deadletter")] = {"0": 2}
    expected[s.topic("queries.status")] = {"0": 1}
    assert floor(s) == expected
    assert list(expected[s.topic("updates.routed")]) == ["0", "1", "2", "3"]

    flags = ["--bootstrap-servers", s.bootstrap_servers, "--topic-prefix", s.topic_prefix,
             "--partitions", str(s.partitions)]
    assert main(["topics", "floor", *flags]) == 0
    assert json.loads(capsys.readouterr().out) == expected

    # `cbgp topics trim` deletes what lies below the floor (--dry-run: says what it would), and only that.
    below = {topic: parts for topic, parts in expected.items() if any(parts.values())}
    assert main(["topics", "trim", "--dry-run", *flags]) == 0
    assert json.loads(capsys.readouterr().out) == below
    assert all(low == 0 for t in below for low, _high in end_offsets(s, t).values())
    assert main(["topics", "trim", *flags]) == 0
    assert json.loads(capsys.readouterr().out) == below
    assert {t: {str(p): low for p, (low, _high) in end_offsets(s, t).items()} for t in below} == below
    assert floor(s) == expected, "the floor stays where it was"
    assert main(["topics", "trim", *flags]) == 0
    assert json.loads(capsys.readouterr().out) == {}, "nothing left to delete"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_answers_floor_is_what_the_answers_checkpoints_need_and_what_compaction_folded(
        kafka_settings: KafkaSettings) -> None:
    """Two readers of answers: the answers service restores a partition from its last checkpoint, which says what
    it reads of answers (``cbgp-needs``), and the Spark job's compaction, once its group committed (a fleet
    without the Spark job does not hold the answers back).  Without a checkpoint everything is needed."""
    from services.kafka.checkpoint_log import checkpoint_records

    s = kafka_settings
    producer = make_producer(s)
    for partition in (0, 1):
        for i in range(30):
            producer.produce(s.topic("answers"), value=b"a%d" % i, partition=partition)
    for output in checkpoint_records(s.topic("checkpoints.deltas"), 0, b"deltas/0", b"blob", 7, "c1",
                                     needs={"answers": 25}):
        producer.produce(output.topic, value=output.value, key=output.key, partition=output.partition,
                         headers=output.headers)
    assert producer.flush(10) == 0

    def answers_floor() -> dict[str, int]:
        return floor(s, [spec("answers")])[s.topic("answers")]

    assert answers_floor() == {"0": 25, "1": 0, "2": 0, "3": 0}  # partition 1: no checkpoint
    spark = make_consumer(s, f"{s.topic_prefix}spark-compaction")
    try:  # the compaction has folded the first 20 answers of partition 0
        spark.commit(offsets=[TopicPartition(s.topic("answers"), 0, 20)], asynchronous=False)
    finally:
        spark.close()
    assert answers_floor() == {"0": 20, "1": 0, "2": 0, "3": 0}


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_routed_floor_keeps_what_checkpoints_bases_and_registrations_they_lack_read(
        kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three readers of updates.routed below the workers' positions: a restore from a shard's checkpoint (what
    its ``needs`` say), a registration moving ingest's snapshot to its point (the routed offsets the snapshot
    matches), and a registration the checkpoint lacks, caught up at its point (the point and the Frontier mark
    before it).  A registration the checkpoint holds (a plan below the queries.plans offset it reflects) holds
    nothing back; without a checkpoint or a snapshot, everything is needed.  Registrations lacked at one seq
    share one point, found once per partition, and the bisections read through one consumer, not one per read."""
    from services import codec
    from services.kafka import replay
    from services.worker import points as worker_points
    from services.kafka.checkpoint_log import checkpoint_records
    from services.state import presence
    from services.worker.points import log_tail, point_of
    from services.worker.shard import decode_changes
    from tests.fleet_support import generate_patch
    from tests.worker_support import N, ingest_logs

    s = kafka_settings
    snapshots: list = []
    logs = ingest_logs(generate_patch(800, seed=4), snapshots=snapshots)
    producer = make_producer(s)
    for p in range(N):
        for value in logs[("routed", p)]:
            producer.produce(s.topic("updates.routed"), value=value, partition=p)
    seqs = [c.seq for value in logs[("whole", 0)] for c in decode_changes("whole", value)]

    def plan(name: str, seq: int) -> bytes:
        return codec.encode("QueryPlan", {"query_id": name, "sparql": "SELECT * WHERE { ?s ?p ?o }", "options": {},
                                          "plan_json": "{}", "projected": [], "registered_at_seq": 0,
                                          "registered_at_change_seq": seq, "version": 1})

    early, late = seqs[len(seqs) // 5], seqs[len(seqs) // 2]
    for name, seq in (("held", early), ("lacking", late), ("lacking-too", late)):  # queries.plans 0, 1, 2 of p0
        producer.produce(s.topic("queries.plans"), value=plan(name, seq), key=name.encode(), partition=0)
    high = {p: len(logs[("routed", p)]) for p in range(N)}
    for p in range(3):  # partition 3: no checkpoint
        needs = {"updates.routed": high[p] - 2, "queries.plans/0": 1, "queries.plans/1": 0}
        for output in checkpoint_records(s.topic("checkpoints.routed"), p, b"routed/%d" % p, b"blob", high[p], "c",
                                         needs=needs):
            producer.produce(output.topic, value=output.value, key=output.key, partition=output.partition,
                             headers=output.headers)
    assert producer.flush(10) == 0

    def routed_floor() -> dict[int, int]:
        return {int(p): offset for p, offset in floor(s, [spec("updates.routed")])[s.topic("updates.routed")].items()}

    assert routed_floor() == {p: 0 for p in range(N)}, "no snapshot of ingest: registrations read from offset 0"
    present, ends = snapshots[-2][:2]
    blob = presence.snapshot(present, [], {"format": 1, "facts": {"routed_ends": {str(p): e for p, e in ends.items()}}})
    for output in checkpoint_records(s.topic("checkpoints.ingest"), 0, b"ingest/0", blob, 0, "i"):
        producer.produce(output.topic, value=output.value, key=output.key, partition=output.partition,
                         headers=output.headers)
    assert producer.flush(10) == 0

    def records(partition: int, start: int, end: int | None) -> list:
        return list(enumerate(logs[("routed", partition)][start:end], start))

    expected = {3: 0}
    for p in range(3):
        point = point_of(records, p, late, high[p])
        expected[p] = min(high[p] - 2, ends[p], point, log_tail(records, p, point).mark_offset)
    found: list = []
    point_of_ = worker_points.point_of
    monkeypatch.setattr(worker_points, "point_of", lambda *args, **kw: found.append(args[1:3]) or point_of_(*args, **kw))
    opened: list = []

    class Counted(replay.Consumer):  # type: ignore[misc,valid-type]
        def __init__(self, *args, **kw) -> None:  # noqa: ANN002, ANN003
            opened.append(1)
            super().__init__(*args, **kw)

    monkeypatch.setattr(replay, "Consumer", Counted)
    assert routed_floor() == expected
    assert all(expected[p] > 0 for p in range(3))
    assert sorted(found) == [(p, late) for p in range(3)], "one point per partition for the two plans at one seq"
    plans_partitions = sum(1 for _low, high in end_offsets(s, s.topic("queries.plans")).values() if high > 0)
    assert len(opened) == 1 + plans_partitions, "one consumer for every bisection read, one per plans partition"


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_the_parts_floor_keeps_what_the_answers_checkpoints_and_the_spark_assembly_read(
        kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two readers of deltas.parts: the answers service from each partition's last checkpoint, and the Spark
    job's assembly while a product is multiplied there: from its group's offsets, and before its first commit
    (a JVM that starts a minute after the fleet) from the start.  A product placed by centre holds nothing."""
    from services import codec
    from services.kafka.checkpoint_log import checkpoint_records
    from services.wire import registrations

    s = kafka_settings
    t_parts = s.topic("deltas.parts")
    producer = make_producer(s)
    for i in range(30):
        producer.produce(t_parts, value=b"p%d" % i, partition=0)
    for output in checkpoint_records(s.topic("checkpoints.deltas"), 0, b"deltas/0", b"blob", 25, "c1"):
        producer.produce(output.topic, value=output.value, key=output.key, partition=output.partition,
                         headers=output.headers)
    assert producer.flush(10) == 0

    def parts_floor() -> str:
        return floor(s, [spec("deltas.parts")])[t_parts]["0"]

    def register(query_id: str, placement: str) -> None:
        producer.produce(s.topic("queries.plans"), key=query_id.encode(), partition=0,
                         value=codec.encode("QueryPlan", {
                             "query_id": query_id, "options": {}, "projected": [], "registered_at_seq": 3,
                             "sparql": "SELECT * WHERE { ?a <http://x/p> ?b . ?c <http://x/q> ?d }",
                             "plan_json": json.dumps({"placement": placement}), "registered_at_change_seq": -1,
                             "version": 1}))
        assert producer.flush(10) == 0

    assert parts_floor() == 25, "no query is multiplied in Spark: only the answers checkpoint counts"
    register("by-centre-product", "by-centre")
    assert parts_floor() == 25, "a product placed by centre is multiplied by the answers service"
    register("single-owner-product", "single-owner")
    assert parts_floor() == 0, "the assembly's first batch reads from the start"
    parsed: list = []
    multiplies = registrations.spark_multiplies
    monkeypatch.setattr(registrations, "spark_multiplies", lambda *args: parsed.append(args) or multiplies(*args))
    assert parts_floor() == 0 and parsed == [], "a trimmer's next floors parse no plan they parsed before"
    assembly = make_consumer(s, f"{s.topic_prefix}spark-assembly")
    try:
        assembly.commit(offsets=[TopicPartition(t_parts, 0, 12)], asynchronous=False)
    finally:
        assembly.close()
    assert parts_floor() == 12, "then from its group's offset"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_encoded_floor_keeps_what_ingest_whole_shards_spark_windows_and_registrations_read(
        kafka_settings: KafkaSettings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The readers of updates.encoded below its end: ingest's restore and a whole shard moved from ingest's
    snapshot (the offset it reflects), a whole shard's restore (its checkpoint's needs, else its committed offset,
    else, never committed, where its queries were registered), the Spark windows (their group's offset; before
    their first commit, the registration of the windowed queries) and a registration (the record of the last
    change).  Without a snapshot, everything is needed."""
    from services import codec
    from services.kafka.checkpoint_log import checkpoint_records
    from services.wire.records import query_partition
    from services.state import presence
    from tests.fleet_support import generate_patch
    from tests.worker_support import N, ingest_logs

    s = kafka_settings
    # The floor is taken by a process that may call no endpoint (``make run``'s trimmer, an operator's ``cbgp
    # topics trim``): the SERVICE queries below count all the same.
    monkeypatch.delenv("CBGP_SERVICE_ALLOW", raising=False)
    snapshots: list = []
    logs = ingest_logs(generate_patch(600, seed=6), snapshots=snapshots)
    producer = make_producer(s)
    t_encoded = s.topic("updates.encoded")
    for value in logs[("whole", 0)]:
        producer.produce(t_encoded, value=value, partition=0)
    high = len(logs[("whole", 0)])
    assert producer.flush(10) == 0

    def encoded_floor() -> int:
        return floor(s, [spec("updates.encoded")])[t_encoded]["0"]

    def publish(outputs: list) -> None:
        for output in outputs:
            producer.produce(output.topic, value=output.value, key=output.key, partition=output.partition,
                             headers=output.headers)
        assert producer.flush(10) == 0

    def commit(group: str, offset: int) -> None:
        consumer = make_consumer(s, f"{s.topic_prefix}{group}")
        try:
            consumer.commit(offsets=[TopicPartition(t_encoded, 0, offset)], asynchronous=False)
        finally:
            consumer.close()

    assert encoded_floor() == 0, "no snapshot of ingest: ingest and the whole shards read from offset 0"
    snapshot = snapshots[-3]
    blob = presence.snapshot(snapshot.present, [], {"format": 1, "facts": {"seq": snapshot.seq},
                                                    "positions": {t_encoded: {"0": snapshot.encoded_offset}}})
    publish(checkpoint_records(s.topic("checkpoints.ingest"), 0, b"ingest/0", blob, 0, "i"))
    assert 0 < snapshot.encoded_offset < high - 1
    assert encoded_floor() == snapshot.encoded_offset, "nothing else reads below the snapshot"

    # A whole query (its plan says single-owner) whose shard never committed: from where it was registered on.
    query, registered = "whole-one", snapshot.encoded_offset - 6
    owner = query_partition(query, N)
    producer.produce(s.topic("queries.plans"), key=query.encode(), partition=0, value=codec.encode("QueryPlan", {
        "query_id": query, "options": {},
        "sparql": "SELECT * WHERE { ?s ?p ?o SERVICE <http://endpoint.example/sparql> { ?o <http://x/q> ?n } }",
        "plan_json": '{"placement":"single-owner"}', "projected": [], "registered_at_seq": registered,
        "registered_at_change_seq": -1, "version": 1}))
    assert producer.flush(10) == 0
    assert encoded_floor() == registered
    commit(f"workers.encoded.{owner}", high)  # its shard committed: from ingest's snapshot moved there
    assert encoded_floor() == snapshot.encoded_offset
    publish(checkpoint_records(s.topic("checkpoints.whole"), owner, b"whole/%d" % owner, b"blob", high - 3, "w",
                               needs={"updates.encoded": snapshot.encoded_offset - 2}))
    assert encoded_floor() == snapshot.encoded_offset - 2, "its checkpoint's restore checks its last change's record"
    # A windowed query: the Spark windows, not started or not through their first batch, will read from its
    # registration offset on.
    windowed = {"query_id": "windowed", "sparql": "SELECT * WHERE { ?s ?p ?o }",
                "options": {"window": "sliding", "range": "PT60S", "step": "PT10S"}, "plan_json": "{}",
                "projected": [], "registered_at_seq": snapshot.encoded_offset - 4, "registered_at_change_seq": -1,
                "version": 1}
    producer.produce(s.topic("queries.plans"), key=b"windowed", partition=0,
                     value=codec.encode("QueryPlan", windowed))
    assert producer.flush(10) == 0
    assert encoded_floor() == snapshot.encoded_offset - 4, "the windows' first batch reads from the registration"
    # A windowed SERVICE query, registered earlier.
    service = dict(windowed, query_id="service-windowed", registered_at_seq=snapshot.encoded_offset - 5,
                   sparql="SELECT * WHERE { ?t <http://x/mentions> ?u "
                          "SERVICE <http://endpoint.example/sparql> { ?u <http://x/followers> ?n } }")
    producer.produce(s.topic("queries.plans"), key=b"service-windowed", partition=0,
                     value=codec.encode("QueryPlan", service))
    assert producer.flush(10) == 0
    assert encoded_floor() == snapshot.encoded_offset - 5, "the windows' first batch reads from its registration"
    commit("spark-windows", 4)
    assert encoded_floor() == 4, "the Spark windows read from their group's offset"


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_floor_leaves_out_topics_not_created_yet(kafka_broker) -> None:  # type: ignore[no-untyped-def]
    assert floor(kafka_broker.settings(topic_prefix="floor-nothing-here.")) == {}


def test_a_checkpoint_topic_may_not_lose_its_last_checkpoint_to_age() -> None:
    from services.kafka.topics import retention_problems, spec

    problems = retention_problems("c", spec("checkpoints.routed"), {"cleanup.policy": "delete", "retention.ms": "1000"})
    assert problems == ["c: retention.ms=1000, needs -1 (it holds the last checkpoints, whose writers delete the "
                        "older ones themselves)"]
    assert retention_problems("d", spec("deltas.parts"), {"cleanup.policy": "delete", "retention.ms": "1000"},
                              {"retention.ms": "1000"}) == []  # bounded by the answers checkpoints
