"""Operator queries through the fleet as real processes on the embedded broker: FILTER, OPTIONAL
and GROUP BY + COUNT + HAVING registered before the data, COUNT DISTINCT over a UNION, an ASK and a CONSTRUCT
registered mid-stream, and the worker killed (-9) and restarted between the halves of the stream.  pyoxigraph
re-evaluating each query after every update is the oracle of every answer: per update (seq) for live deltas,
the answers at registration for the snapshot, the final answers for answers.current.  One fleet run for all."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from services import codec
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_producer, produce_sync
from services.wire.records import query_partition
from tests.fleet_support import Fleet, generate_patch, publish_patch, read_answers, read_current, wait_answers
from tests.operators_support import LATE_QUERIES, OPERATOR_QUERIES, changes_of_lines, oracle_deltas, plan_record

pytestmark = [pytest.mark.slow]


def publish(settings: KafkaSettings, queries: dict[str, str], seq: int = 0) -> None:
    producer = make_producer(settings)
    for name, text in queries.items():
        produce_sync(producer, settings.topic("queries.plans"), codec.encode("QueryPlan", plan_record(name, text, seq)),
                     name.encode(), partition=query_partition(name, settings.partitions))


def expected_of(deltas: Counter, name: str) -> Counter:
    return Counter({(seq, sign, key): n for (q, seq, sign, key), n in deltas.items() if q == name})


@pytest.mark.timeout(300)
def test_filter_optional_aggregate_ask_construct_in_the_fleet_late_and_after_kill_9(kafka_settings: KafkaSettings,
                                                                                       tmp_path: Path) -> None:
    lines = generate_patch(2400, seed=61)
    first, second = lines[:1200], lines[1200:]
    changes = changes_of_lines(lines)
    half_seq = len(changes_of_lines(first))
    deltas, final, snapshot = oracle_deltas(changes, None, OPERATOR_QUERIES, LATE_QUERIES, half_seq)
    live = {name: expected_of(deltas, name) for name in {**OPERATOR_QUERIES, **LATE_QUERIES}}
    in_first = {name: sum(n for (seq, _s, _k), n in live[name].items() if seq <= half_seq) for name in OPERATOR_QUERIES}
    assert all(in_first.values()) and all(live.values()), "the stream must change every query in each half"

    # The worker is a static group member (as in the fault tests): the embedded broker never expires a SIGKILLed
    # member, the restarted one replaces it at once.
    static = replace(kafka_settings, extra={**kafka_settings.extra,
                                            "group.instance.id": f"{kafka_settings.topic_prefix}w0"})
    with Fleet(kafka_settings, tmp_path / "logs") as fleet, Fleet(static, tmp_path / "logs") as workers:
        publish(kafka_settings, OPERATOR_QUERIES)
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        workers.start("w0", "worker", "--worker-id", "w0")
        fleet.start("answers", "answers", "--instance-id", "a1")
        publish_patch(kafka_settings, first)
        wait_answers(kafka_settings, in_first, timeout=120)  # the owner is past the first half
        # as the registry does: registered at the end offset of updates.encoded (whole shard 0 opens there)
        publish(kafka_settings, LATE_QUERIES, seq=end_offsets(kafka_settings, kafka_settings.topic("updates.encoded"))[0][1])
        wait_answers(kafka_settings, {name: sum(snapshot[name].values()) for name in LATE_QUERIES}, timeout=60)
        workers.procs.pop("w0").kill()  # kill -9: the restarted worker rebuilds the operators' state from the log
        publish_patch(kafka_settings, second)
        workers.start("w0", "worker", "--worker-id", "w0")
        want = {name: sum(live[name].values()) + sum(snapshot.get(name, Counter()).values()) for name in live}
        got = wait_answers(kafka_settings, want, timeout=150)
        time.sleep(1.0)  # anything duplicated would arrive right after the expected count
        got = read_answers(kafka_settings)
        current = read_current(kafka_settings)

    for name in live:
        answers = got[name]
        assert [a["n"] for a in answers] == list(range(1, len(answers) + 1)), f"{name}: numbering has gaps/repeats"
        snap = Counter(a["key"] for a in answers if a["snapshot"])
        assert snap == snapshot.get(name, Counter()), f"{name}: snapshot differs from pyoxigraph"
        assert all(a["sign"] == "+" for a in answers if a["snapshot"])
        got_live = Counter((a["seq"], a["sign"], a["key"]) for a in answers if not a["snapshot"])
        assert got_live == live[name], f"{name}: per-update deltas differ from pyoxigraph"
        seqs = [a["seq"] for a in answers if not a["snapshot"]]
        assert seqs == sorted(seqs), f"{name}: live answers not in seq order"
        assert current.get(name, Counter()) == final[name], f"{name}: answers.current differs from pyoxigraph"
