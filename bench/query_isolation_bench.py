"""``/query`` in a forked child against the pool's thread: what the isolation costs a small query, and what it
saves on a hostile one.

Usage: .venv/bin/python bench/query_isolation_bench.py [--runs 200] [--max-memory 512] [--data DIR]

The LSBench-1000 static graph (``mr0_sibdataset1000.nt.gz``, 102,356 triples; a synthetic friendship graph of the
same size without ``--data``) in a pyoxigraph store, evaluated through ``services.gateway.query.evaluate`` as the
gateway does (SPARQL JSON written), alternating the two ways ``--runs`` times each: a user's friends (a handful of
rows), their friends' names (a few hundred), and a COUNT over every triple.  Then ``?a foaf:knows+ ?b`` counted
once each way: its time and the process's peak memory growth (the child's is refused at ``--max-memory``).
Prints median and p99 in ms per query and way, and one JSON line; no assertion.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyoxigraph as ox  # noqa: E402

from services.gateway.core import Limits  # noqa: E402
from services.gateway.query import QueryRefused, evaluate  # noqa: E402
from services.state.forked import ForkedJob  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "lsbench-1000"
KNOWS = "http://xmlns.com/foaf/0.1/knows"
JSON = "application/sparql-results+json"


class Graph:
    """GraphSource's two entry points over a store that does not change."""

    def __init__(self, store: ox.Store) -> None:
        self.store = store

    def forked(self, fn):  # noqa: ANN001, ANN201
        return ForkedJob(lambda: fn(self.store, 0))

    def query(self, text: str):  # noqa: ANN201
        return self.store.query(text), 0


def load(data: Path) -> ox.Store:
    store = ox.Store()
    static = data / "mr0_sibdataset1000.nt.gz"
    if static.exists():
        with gzip.open(static, "rb") as f:
            store.bulk_load(f, ox.RdfFormat.TURTLE)
        return store
    import random

    rnd = random.Random(7)
    user = lambda i: ox.NamedNode(f"http://example.org/u{i}")  # noqa: E731
    store.bulk_extend(ox.Quad(user(i), ox.NamedNode(KNOWS), user(rnd.randrange(1000))) for i in range(1000)
                      for _ in range(19))
    store.bulk_extend(ox.Quad(user(i), ox.NamedNode("http://xmlns.com/foaf/0.1/name"), ox.Literal(f"user {i}"))
                      for i in range(1000))
    return store


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--max-memory", type=int, default=Limits().query_max_memory_mb)
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    store = load(args.data)
    someone = next(iter(store.quads_for_pattern(None, ox.NamedNode(KNOWS), None))).subject
    queries = {
        "friends": f"SELECT ?f WHERE {{ {someone} <{KNOWS}> ?f }}",
        "friends_of_friends_names": f"SELECT DISTINCT ?n WHERE {{ {someone} <{KNOWS}>/<{KNOWS}> ?g . "
                                    "?g <http://xmlns.com/foaf/0.1/name> ?n }",
        "count_all": "SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }",
    }
    ways = {"thread": SimpleNamespace(limits=Limits(query_max_memory_mb=0), graph=Graph(store)),
            "child": SimpleNamespace(limits=Limits(query_max_memory_mb=args.max_memory), graph=Graph(store))}
    print(f"{len(store):,} triples; process {peak_mb():.0f} MB; {args.runs} runs per query and way, alternated",
          flush=True)
    times: dict[str, dict[str, list[float]]] = {q: {w: [] for w in ways} for q in queries}
    for _ in range(args.runs):
        for name, text in queries.items():
            for way, gw in ways.items():
                started = time.perf_counter()
                evaluate(gw, text, threading.Event(), JSON)
                times[name][way].append((time.perf_counter() - started) * 1000)
    report: dict = {"triples": len(store), "runs": args.runs, "max_memory_mb": args.max_memory, "queries": {}}
    for name in queries:
        row = {}
        for way in ways:
            ms = sorted(times[name][way])
            row[way] = {"p50_ms": round(statistics.median(ms), 2), "p99_ms": round(ms[int(0.99 * (len(ms) - 1))], 2)}
        report["queries"][name] = row
        print(f"  {name:26} " + "  ".join(f"{w}: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms"
                                           for w, r in row.items()), flush=True)
    hostile = f"SELECT (COUNT(*) AS ?n) WHERE {{ ?a <{KNOWS}>+ ?b }}"
    report["hostile"] = {}
    for way in ("child", "thread"):  # (the child first: the thread's growth stays in this process's peak)
        before, started = peak_mb(), time.perf_counter()
        try:
            body, _media, _seq = evaluate(ways[way], hostile, threading.Event(), JSON)
            outcome = "answered " + json.loads(body)["results"]["bindings"][0]["n"]["value"]
        except QueryRefused as refused:
            outcome = f"{refused.status}: {refused}"
        seconds, grew = time.perf_counter() - started, peak_mb() - before
        report["hostile"][way] = {"seconds": round(seconds, 2), "peak_growth_mb": round(grew), "outcome": outcome}
        print(f"  knows+ counted, {way}: {seconds:.2f} s, this process's peak grew {grew:.0f} MB; {outcome}",
              flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
