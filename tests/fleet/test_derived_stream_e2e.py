"""Derived streams through the fleet as real processes on the embedded broker: a CONSTRUCT
registered with ``stream=<iri>`` writes its triple deltas to updates.raw, ingest puts them in named graph <iri>,
and a BGP query reads them back with ``GRAPH <iri>`` joined with the base graph.  Checked against pyoxigraph over
the total order read back from updates.encoded: after every run of derived changes the derived graph equals the
CONSTRUCT of the base graph as of a base update (never going back), the reader's answers per seq equal its
re-evaluation, its current answers equal it over base + CONSTRUCT(base); unregistering retracts the graph."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pyoxigraph as ox
import pytest

from cbgp.terms import DEFAULT_GRAPH_ID
from services import codec
from services.kafka.config import KafkaSettings
from services.kafka.client import make_producer, produce_sync
from services.kafka.client import read_all
from services.wire.records import query_partition
from tests.derived_support import ADULTS, DERIVED, READER, construct, expected_reader, per_seq_deltas, plan_of, quad
from tests.fleet_support import Fleet, generate_patch, publish_patch, read_answers, read_current, unpublish_plan

pytestmark = [pytest.mark.slow]


def publish(settings: KafkaSettings, query_id: str, record: dict) -> None:
    produce_sync(make_producer(settings), settings.topic("queries.plans"), codec.encode("QueryPlan", record),
                 query_id.encode(), partition=query_partition(query_id, settings.partitions))


def total_order(settings: KafkaSettings) -> list[tuple]:
    """updates.encoded as ``(seq, sign, s, p, o, g)`` with terms (g None: the default graph), in seq order."""
    terms = {}
    for msg in read_all(settings, settings.topic("dictionary"), timeout=30):
        terms.update(codec.dictionary_entries(msg.value()))
    out = []
    for msg in read_all(settings, settings.topic("updates.encoded"), timeout=30):
        for seq, sign, s, p, o, g, _time, _role, refresh in codec.encoded_changes(msg.value()):
            if not refresh:
                out.append((seq, sign, terms[s], terms[p], terms[o], None if g == DEFAULT_GRAPH_ID else terms[g]))
    out.sort(key=lambda c: c[0])
    return out


def wait_current(settings: KafkaSettings, name: str, want: Counter, timeout: float) -> Counter:
    deadline = time.monotonic() + timeout
    while True:
        got = read_current(settings).get(name, Counter())
        if got == want or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


@pytest.mark.timeout(240)
def test_a_derived_stream_read_back_by_a_query_equals_pyoxigraph_in_the_fleet(kafka_settings: KafkaSettings,
                                                                              tmp_path: Path) -> None:
    lines = generate_patch(1500, seed=71)
    base = ox.Store()
    present: set = set()
    for line in lines:  # the base graph at the end (ingest's set semantics)
        s, p, o = line[2:-2].split(" ", 2)
        (present.add if line[0] == "A" else present.discard)((s, p, o))
    base.extend(quad(s, p, o, None) for s, p, o in present)
    want = expected_reader(base)
    assert len(want) > 5 and len(construct(base)) > 5

    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        publish(kafka_settings, "reader", plan_of("reader", READER))
        publish(kafka_settings, "adults", plan_of("adults", ADULTS, stream=DERIVED))
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        fleet.start("w0", "worker", "--worker-id", "w0")
        fleet.start("answers", "answers", "--instance-id", "a1")
        for start in range(0, len(lines), 200):  # in slices: derived records interleave with base ones
            publish_patch(kafka_settings, lines[start:start + 200])
            time.sleep(0.6)
        assert wait_current(kafka_settings, "reader", want, 120) == want, "reader != pyoxigraph(base + CONSTRUCT)"
        time.sleep(1.0)  # anything more (a duplicate, a late derived record) would arrive now
        changes = total_order(kafka_settings)
        got = read_answers(kafka_settings)
        unpublish_plan(kafka_settings, "adults")  # the stream ends: its graph is retracted
        after = wait_current(kafka_settings, "reader", Counter(), 60)
        retracted = total_order(kafka_settings)

    # the derived graph, after every run of derived changes, is the CONSTRUCT of the base graph as of a base update
    store, derived = ox.Store(), set()
    constructs = [frozenset()]  # CONSTRUCT of the base graph after the i-th base change
    matched, runs = 0, 0
    for i, (seq, sign, s, p, o, g) in enumerate(changes):
        if g is None:
            (store.add if sign > 0 else store.remove)(quad(s, p, o, None))
            constructs.append(frozenset(construct(store)))
            continue
        assert g == DERIVED, f"seq {seq}: a change in an unexpected graph {g}"
        (derived.add if sign > 0 else derived.discard)((s, p, o))
        if i + 1 == len(changes) or changes[i + 1][5] is None:  # the end of a run of derived changes
            found = next((b for b in range(matched, len(constructs)) if constructs[b] == derived), None)
            assert found is not None, f"seq {seq}: the derived graph is no CONSTRUCT of a base graph since #{matched}"
            matched, runs = found, runs + 1
    assert derived == set(constructs[-1]) and runs >= 3, "the derived graph ends as CONSTRUCT(base)"

    # the reader's answers: per seq as pyoxigraph re-evaluating it over the total order (derived changes included)
    answers = got["reader"]
    assert [a["n"] for a in answers] == list(range(1, len(answers) + 1))
    live = Counter((a["seq"], a["sign"], a["key"]) for a in answers if not a["snapshot"])
    expected, final = per_seq_deltas(changes, READER)
    assert final == want and live == expected, "the reader's deltas per seq differ from pyoxigraph"

    # unregistered: the derived graph is emptied (one atomic DROP) and the reader, which needs it, has no answers
    assert after == Counter(), "the reader still answers after the derived stream was retracted"
    graph: set = set()
    for seq, sign, s, p, o, g in retracted:
        if g == DERIVED:
            (graph.add if sign > 0 else graph.discard)((s, p, o))
    assert graph == set() and len(retracted) == len(changes) + len(constructs[-1])
