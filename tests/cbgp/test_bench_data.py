"""The benchmark's data: the generator and the deletion schedule produce well-formed streams.

Checked on a small generated dataset (fast, no shared data needed) and, when the shared LSBench
files are present, on a slice of them: every term is canonical N-Triples that the product's parser
reads back, deletes only remove present triples and come after their insert, about 20% of the
triples are deleted, inserts never duplicate a present triple, and the generator keeps the
LSBench vocabulary and degree shape the benchmark's queries rely on.  No timing is asserted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import lsbench  # noqa: E402

from cbgp.engine.engine import Engine  # noqa: E402
from cbgp.inputs.formats import InputError, parse_ntriples  # noqa: E402
from cbgp.query.sparql import parse_query  # noqa: E402


@pytest.fixture(scope="module")
def small() -> lsbench.Dataset:
    return lsbench.generate(users=120, seed=3)


@pytest.fixture(scope="module")
def stream(small: lsbench.Dataset) -> lsbench.UpdateStream:
    return lsbench.build_updates(small, delete_fraction=0.2, seed=5)


def check_stream(stream: lsbench.UpdateStream) -> None:
    present: set[tuple[str, str, str]] = set()
    inserted_at: dict[tuple[str, str, str], int] = {}
    for position, (op, s, p, o) in enumerate(stream.updates):
        triple = (s, p, o)
        if op == 1:
            assert triple not in present, f"duplicate insert at {position}: {triple}"
            present.add(triple)
            inserted_at[triple] = position
        else:
            assert op == -1
            assert triple in present, f"delete of an absent triple at {position}: {triple}"
            assert position >= stream.n_static, "deletes start after the static graph is loaded"
            assert inserted_at[triple] < position
            present.discard(triple)
    stats = stream.stats
    assert stats["inserts"] + stats["deletes"] == stats["updates"] == len(stream.updates)
    assert all(op == 1 for op, *_ in stream.updates[: stream.n_static])


def test_generated_stream_is_well_formed(stream: lsbench.UpdateStream) -> None:
    check_stream(stream)


def test_about_a_fifth_is_deleted_and_interleaved(stream: lsbench.UpdateStream) -> None:
    stats = stream.stats
    assert 0.17 <= stats["deletes"] / stats["inserts"] <= 0.23
    # Interleaved: deletes are spread over the stream phase, not bunched at its end.
    stream_part = stream.updates[stream.n_static:]
    half = len(stream_part) // 2
    first_half_deletes = sum(1 for op, *_ in stream_part[:half] if op < 0)
    assert first_half_deletes >= 0.2 * stats["deletes"]
    # Deleted triples come from the static graph as well as from the streams.
    static = {(s, p, o) for _, s, p, o in stream.updates[: stream.n_static]}
    deleted = [(s, p, o) for op, s, p, o in stream.updates if op < 0]
    assert any(t in static for t in deleted) and any(t not in static for t in deleted)


def test_terms_are_canonical_ntriples(stream: lsbench.UpdateStream) -> None:
    sample = stream.updates[:: max(1, len(stream.updates) // 3000)]
    text = "".join(f"{s} {p} {o} .\n" for _, s, p, o in sample)
    parsed = list(parse_ntriples(text))
    assert not [x for x in parsed if isinstance(x, InputError)]
    assert [(u.s, u.p, u.o) for u in parsed] == [(s, p, o) for _, s, p, o in sample]


def test_generator_keeps_the_lsbench_shape(small: lsbench.Dataset) -> None:
    users = 120
    assert set(small.streams) == set(lsbench.STREAMS)
    preds = Counter(p for _, p, _ in small.static)
    knows = preds[f"<{lsbench.FOAF}knows>"]
    assert 10 * users <= knows <= 30 * users  # ~19 directed foaf:knows per user in LSBench-1000
    photo_preds = Counter(p for _, p, _ in small.streams["photo"])
    photos = sum(1 for _, p, o in small.streams["photo"] if o == f"<{lsbench.SIB}Photo>")
    assert 10 * users <= photos <= 30 * users  # ~18.5 photos per user
    assert 2 * photos <= photo_preds[f"<{lsbench.SIB}usertag>"] <= 7 * photos  # ~4.4 tags per photo
    likes = len(small.streams["postlike"]) + len(small.streams["photolike"])
    assert likes >= 40 * users  # ~100 distinct likes per user
    # Only vocabulary of the LSBench output: every predicate is in one of its namespaces.
    namespaces = tuple(lsbench.PREFIXES.values())
    all_triples = [*small.static, *(t for s in small.streams.values() for t in s)]
    assert all(p[1:-1].startswith(namespaces) for _, p, _ in all_triples)


def test_generator_is_deterministic() -> None:
    a = lsbench.build_updates(lsbench.generate(users=40, seed=9), seed=2).updates
    b = lsbench.build_updates(lsbench.generate(users=40, seed=9), seed=2).updates
    assert a == b


def test_generator_gives_the_same_stream_in_every_process() -> None:
    """Python salts string hashes per process: a stream that followed a set's order of strings changed from run
    to run (and with it the bench's expected answers)."""
    script = ("import hashlib, sys; sys.path.insert(0, sys.argv[1]); import lsbench; "
              "u = lsbench.build_updates(lsbench.generate(users=60, seed=3), seed=2).updates; "
              "print(hashlib.sha256(repr(u).encode()).hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", script, str(BENCH)], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": str(salt)}).stdout for salt in (1, 2, 3)}
    assert len(digests) == 1, digests


def test_every_benchmark_query_has_answers_on_generated_data(stream: lsbench.UpdateStream) -> None:
    """The queries parse, and each class sees answers come and go on the generator's stream."""
    queries = sorted((BENCH / "queries").glob("*.rq"))
    classes = {q.stem.split("_")[0] for q in queries}
    assert classes == {"star", "path", "cycle", "snowflake", "loose"}
    engine = Engine()
    for q in queries:
        parse_query(q.read_text())
        engine.register(q.stem, q.read_text())
    encode = engine.dictionary.encode
    added: Counter[str] = Counter()
    removed: Counter[str] = Counter()
    for op, s, p, o in stream.updates:
        for name, sign, _row in engine.apply(op, encode(s), encode(p), encode(o)):
            (added if sign > 0 else removed)[name.split("_")[0]] += 1
    for cls in ("star", "path", "cycle", "snowflake"):
        assert added[cls] > 0 and removed[cls] > 0, (cls, added, removed)


@pytest.mark.skipif(lsbench.find_files(lsbench.DEFAULT_DATA) is None, reason="shared LSBench data not present")
def test_shared_lsbench_files_load_into_a_well_formed_stream() -> None:
    files = lsbench.find_files(lsbench.DEFAULT_DATA)
    assert files is not None
    import gzip

    from cbgp.inputs.formats import parse_turtle

    # A slice of each file (the prefix lines plus the first statements) keeps this test fast.
    sliced: dict[str, list[tuple[str, str, str]]] = {}
    for name, path in files.items():
        with gzip.open(path, "rt", encoding="utf-8") as f:
            head = "".join(line for _, line in zip(range(3000), f))
        items = list(parse_turtle(head))
        assert not [x for x in items if isinstance(x, InputError)]
        sliced[name] = [(u.s, u.p, u.o) for u in items]
    dataset = lsbench.Dataset(sliced.pop("static"), sliced, "slice")
    stream = lsbench.build_updates(dataset)
    check_stream(stream)
    assert stream.stats["duplicates_dropped"] > 0  # the like streams repeat likes
