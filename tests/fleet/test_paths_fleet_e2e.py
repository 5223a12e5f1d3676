"""Property paths through the fleet as real processes on the embedded broker: closures anchored at either end, an
unanchored closure joined to a pattern, a sequence, an alternative with an inverse, a `*` and a negated property set
(all placed by centre), and a `*` joined to variable predicates that share no end (single-owner), registered before
the data or mid-stream, with a worker killed (-9) and restarted between the halves. pyoxigraph re-evaluating every
query after every update is the oracle of every answer: per update for live deltas, at registration for the snapshot,
at the end for answers.current."""

from __future__ import annotations

import re
import time
import urllib.request
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from cbgp.algebra import analyse
from cbgp.query.plan import BY_CENTRE
from services import codec
from services.kafka.client import end_offsets, read_all
from services.kafka.topics import ensure_topics
from services.registry.core import operator_placement
from tests.cbgp.algebra.test_paths_watdiv import queries as watdiv_queries, watdiv
from tests.fixtures.broker import fresh_settings
from tests.fleet.test_operators_fleet_e2e import expected_of, publish
from tests.fleet_support import (EX, Fleet, generate_patch, publish_patch, read_answers, read_current, wait_answers,
                                 wait_for)
from tests.operators_support import changes_of_lines, oracle_deltas

pytestmark = [pytest.mark.slow]
K, L, T = (f"<{EX}{name}>" for name in ("knows", "likes", "type"))

EARLY = {
    "reach": f"SELECT * WHERE {{ <{EX}s0> {K}+ ?y }}",
    "reached": f"SELECT * WHERE {{ ?x ({K}|{L})+ <{EX}s1> }}",
    "closure_typed": f"SELECT ?x ?y WHERE {{ ?x {K}+ ?y . ?y {T} <{EX}Person> }}",
    "star": f"SELECT * WHERE {{ <{EX}s2> {K}* ?y }}",
    "star_chained": f"SELECT ?y ?p ?q WHERE {{ <{EX}s2> {K}* ?y . ?y ?p ?z . ?z ?q <{EX}Jazz> }}",
}
LATE = {
    "sequence": f"SELECT * WHERE {{ ?x {K}/{K} ?y }}",
    "alternative": f"SELECT * WHERE {{ ?x {K}|^{L} ?y }}",
    "negated": f"SELECT * WHERE {{ <{EX}s3> !({K}|{T}) ?y }}",
    "reach_jazz_late": f"SELECT * WHERE {{ <{EX}s4> {K}+ ?y . ?y {L} <{EX}Jazz> }}",
}
SINGLE_OWNER = {"star_chained"}


def test_the_queries_are_placed_as_the_test_says():
    for name, text in {**EARLY, **LATE}.items():
        assert (operator_placement(analyse(text)) == BY_CENTRE) == (name not in SINGLE_OWNER), name


def path_pairs(fleet: Fleet, name: str, query: str) -> int:
    """``cbgp_path_pairs{query=...}`` of process ``name`` (its current life: the last port it logged)."""
    text = fleet.log_text(name)
    port = re.findall(r"event=started metrics_port=(\d+)", text)[-1]
    page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.search(rf'^cbgp_path_pairs{{query="{re.escape(query)}"}} (\S+)$', page, re.M)
    return int(float(found.group(1))) if found else 0


@pytest.mark.timeout(420)
@pytest.mark.parametrize("workers,partitions", [(1, 4), (3, 8)])
def test_paths_in_the_fleet_early_late_and_after_kill_9(kafka_broker, tmp_path: Path, workers: int,
                                                        partitions: int) -> None:
    settings = fresh_settings(kafka_broker, partitions=partitions)
    ensure_topics(settings)
    lines = generate_patch(1600, seed=43, subjects=12)
    first, second = lines[:800], lines[800:]
    changes = changes_of_lines(lines)
    half_seq = len(changes_of_lines(first))
    deltas, final, snapshot = oracle_deltas(changes, None, EARLY, LATE, half_seq)
    live = {name: expected_of(deltas, name) for name in {**EARLY, **LATE}}
    assert all(live.values()), "the stream must change every query"
    in_first = {name: sum(n for (seq, _s, _k), n in live[name].items() if seq <= half_seq) for name in EARLY}

    members = [replace(settings, extra={**settings.extra, "group.instance.id": f"{settings.topic_prefix}w{i}"})
               for i in range(workers)]
    with Fleet(settings, tmp_path / "logs") as fleet:
        fleets = [Fleet(member, tmp_path / "logs") for member in members]
        try:
            publish(settings, EARLY)
            fleet.start("ingest", "ingest", "--instance-id", "i1")
            for i, member in enumerate(fleets):
                member.start(f"w{i}", "worker", "--worker-id", f"w{i}")
            fleet.start("answers", "answers", "--instance-id", "a1")
            publish_patch(settings, first)
            wait_answers(settings, in_first, timeout=150)  # (the LATE registrations may meet a rebalance)
            publish(settings, LATE, seq=end_offsets(settings, settings.topic("updates.encoded"))[0][1])
            wait_answers(settings, {name: sum(snapshot[name].values()) for name in LATE}, timeout=90)
            fleets[-1].procs.pop(f"w{workers - 1}").kill()  # kill -9, restarted as the same static member
            publish_patch(settings, second)
            fleets[-1].start(f"w{workers - 1}", "worker", "--worker-id", f"w{workers - 1}")
            want = {name: sum(live[name].values()) + sum(snapshot.get(name, Counter()).values()) for name in live}
            wait_answers(settings, want, timeout=240)
            time.sleep(1.0)  # anything duplicated would arrive right after the expected count
            got = read_answers(settings)
            current = read_current(settings)
            # cbgp_path_pairs: an anchored closure by centre lives in the answers service and holds what its
            # anchor reaches; a single-owner one in the worker that owns it (both `*`s: s2's knows+)
            wait_for(lambda: path_pairs(fleet, "answers", "reach") == len(final["reach"]), 10.0,
                     "cbgp_path_pairs of reach at the answers service: what s0 reaches")
            reached = len(final["star"])  # (s2 itself included: its knows+ holds it only on a cycle)
            wait_for(lambda: reached - 1 <= path_pairs(fleet, "answers", "star") <= reached, 10.0,
                     "cbgp_path_pairs of star at the answers service: what s2 reaches in one step or more")
            owned = lambda: sum(path_pairs(member, f"w{i}", "star_chained")  # noqa: E731
                                for i, member in enumerate(fleets))
            wait_for(lambda: reached - 1 <= owned() <= reached, 10.0,
                     "cbgp_path_pairs of star_chained at its worker: what s2 reaches in one step or more")
        finally:
            for member in fleets:
                member.__exit__(None, None, None)

    assert_as_pyoxigraph(got, current, live, snapshot, final)


def assert_as_pyoxigraph(got: dict, current: dict, live: dict, snapshot: dict, final: dict) -> None:
    """Each query's answers numbered 1..N, its snapshot, its live deltas per update (in seq order) and
    answers.current as pyoxigraph's."""
    for name in live:
        answers = got[name]
        assert [a["n"] for a in answers] == list(range(1, len(answers) + 1)), f"{name}: numbering has gaps/repeats"
        assert Counter(a["key"] for a in answers if a["snapshot"]) == snapshot.get(name, Counter()), \
            f"{name}: snapshot differs from pyoxigraph"
        got_live = Counter((a["seq"], a["sign"], a["key"]) for a in answers if not a["snapshot"])
        assert got_live == live[name], f"{name}: per-update deltas differ from pyoxigraph"
        seqs = [a["seq"] for a in answers if not a["snapshot"]]
        assert seqs == sorted(seqs), f"{name}: live answers not in seq order"
        assert current.get(name, Counter()) == final[name], f"{name}: answers.current differs from pyoxigraph"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("setting, message", [
    ("CBGP_MAX_PATH_PAIRS", "would hold more than 40 pairs (CBGP_MAX_PATH_PAIRS)"),
    ("CBGP_MAX_PATH_PAIRS_TOTAL", "pairs together, more than 40 (CBGP_MAX_PATH_PAIRS_TOTAL); this query held the most"),
])
def test_a_closure_over_its_bound_stops_alone_and_says_so_on_the_status_topic(kafka_settings, tmp_path: Path,
                                                                              monkeypatch, setting: str,
                                                                              message: str) -> None:
    """A bound of 40 pairs for the fleet, per query or for each process's queries together: an unanchored closure
    by centre (kept by the answers service) and an unanchored `*` joined to variable predicates (single-owner, kept
    by a worker) pass it; each gets one ERROR status on queries.status naming the bound, and the anchored closure
    beside them (at the answers service too, and smaller) stays exact."""
    monkeypatch.setenv(setting, "40")
    queries = {"everyone": f"SELECT * WHERE {{ ?x {K}+ ?y }}",
               "everyone_star": f"SELECT * WHERE {{ ?x {K}* ?y . ?y ?p ?z . ?z ?q ?w }}", "reach": EARLY["reach"]}
    assert operator_placement(analyse(queries["everyone_star"])) != BY_CENTRE
    lines = generate_patch(600, seed=44, subjects=12)
    deltas, final, _snapshot = oracle_deltas(changes_of_lines(lines), None, {"reach": queries["reach"]})
    with Fleet(kafka_settings, tmp_path / "logs") as fleet:
        publish(kafka_settings, queries)
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        fleet.start("w0", "worker", "--worker-id", "w0")
        fleet.start("answers", "answers", "--instance-id", "a1")
        publish_patch(kafka_settings, lines)
        wait_answers(kafka_settings, {"reach": sum(deltas.values())}, timeout=150)
        deadline = time.monotonic() + 60
        while True:
            statuses = [codec.decode("QueryStatus", m.value())
                        for m in read_all(kafka_settings, kafka_settings.topic("queries.status"))]
            stopped = {s["query_id"]: s for s in statuses if s["status"] == "ERROR"}
            if len(stopped) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        time.sleep(1.0)
        got = read_answers(kafka_settings)
        current = read_current(kafka_settings)
    assert set(stopped) == {"everyone", "everyone_star"}, statuses
    for status in stopped.values():
        assert status["message"].startswith("query stopped: the p")
        assert message in status["message"]
    assert sum(1 for s in statuses if s["status"] == "ERROR") == 2, "each stop is told once"
    assert Counter((a["seq"], a["sign"], a["key"]) for a in got["reach"]) == expected_of(deltas, "reach")
    assert current["reach"] == final["reach"]


WATDIV_UPDATES = 3000


@pytest.mark.timeout(600)
@pytest.mark.skipif(not watdiv.DEFAULT_DATA.exists(), reason="shared Stream-WatDiv data not present")
def test_every_path_form_on_stream_watdiv_through_the_fleet_by_centre(kafka_broker, tmp_path: Path) -> None:
    """The eight path queries of every form that `cbgp replay` is checked on over Stream-WatDiv with deletions
    (``tests/cbgp/algebra/test_paths_watdiv.py``), each placed by centre, through 2 workers on 4 partitions: four
    registered before the stream, four halfway.  Per update deltas, snapshots and answers.current equal
    pyoxigraph's."""
    settings = fresh_settings(kafka_broker, partitions=4)
    ensure_topics(settings)
    updates = watdiv.updates(watdiv.load(limit=WATDIV_UPDATES))
    texts = watdiv_queries(updates)
    assert all(operator_placement(analyse(text)) == BY_CENTRE for text in texts.values())
    names = sorted(texts)
    early, late = {n: texts[n] for n in names[::2]}, {n: texts[n] for n in names[1::2]}
    lines = [f"{'A' if d > 0 else 'D'} {s} {p} {o} ." for d, s, p, o in updates]
    first, second = lines[:len(lines) // 2], lines[len(lines) // 2:]
    changes = changes_of_lines(lines)
    half_seq = len(changes_of_lines(first))
    deltas, final, snapshot = oracle_deltas(changes, None, early, late, half_seq)
    live = {name: expected_of(deltas, name) for name in texts}
    in_first = {name: sum(n for (seq, _s, _k), n in live[name].items() if seq <= half_seq) for name in early}
    with Fleet(settings, tmp_path / "logs") as fleet:
        publish(settings, early)
        fleet.start("ingest", "ingest", "--instance-id", "i1")
        fleet.start("w0", "worker", "--worker-id", "w0")
        fleet.start("w1", "worker", "--worker-id", "w1")
        fleet.start("answers", "answers", "--instance-id", "a1")
        publish_patch(settings, first)
        wait_answers(settings, in_first, timeout=150)
        publish(settings, late, seq=end_offsets(settings, settings.topic("updates.encoded"))[0][1])
        wait_answers(settings, {name: sum(snapshot[name].values()) for name in late}, timeout=90)
        publish_patch(settings, second)
        wait_answers(settings, {name: sum(live[name].values()) + sum(snapshot.get(name, Counter()).values())
                                for name in texts}, timeout=240)
        time.sleep(1.0)  # anything duplicated would arrive right after the expected count
        got = read_answers(settings)
        current = read_current(settings)
    assert all(live[name] or snapshot.get(name) for name in texts), "the stream must change every query"
    assert_as_pyoxigraph(got, current, live, snapshot, final)
