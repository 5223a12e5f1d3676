"""Throughput of SPARQL Update delta extraction (`cbgp.inputs.sparql_update`) on a ~100k-quad store.

Usage: .venv/bin/python bench/update_bench.py [--quads 100000] [--requests 2000]

Phases, each run with `UpdateExtractor.apply` and, as a baseline, with plain
`pyoxigraph.Store.update` on an identical store (no delta):
  insert-data   INSERT DATA of 10 quads per request (8 new, 2 already present);
  modify        DELETE/INSERT ... WHERE over GRAPH ?g changing the status of the 10
                members of one group (10 deleted + 10 inserted quads per request);
  copy          COPY of a 10k-quad named graph onto another.
Prints requests/s and quads/s (quads of the reported delta, per second) and the
overhead against the baseline.  The delta sizes are checked: a wrong count aborts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import pyoxigraph as ox

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cbgp.inputs.sparql_update import UpdateExtractor  # noqa: E402

EX = "http://example.org/"
GRAPHS = 10


def build(quads: int) -> ox.Store:
    """Persons in 10 named graphs, 10 properties each; groups of 10 persons share a status."""
    store = ox.Store()
    persons = quads // 10
    batch = []
    for i in range(persons):
        s = ox.NamedNode(f"{EX}person/{i}")
        g = ox.NamedNode(f"{EX}graph/{i % GRAPHS}")
        batch.append(ox.Quad(s, ox.NamedNode(EX + "group"), ox.NamedNode(f"{EX}group/{i // 10}"), g))
        batch.append(ox.Quad(s, ox.NamedNode(EX + "status"), ox.Literal("v0"), g))
        for k in range(8):
            batch.append(ox.Quad(s, ox.NamedNode(f"{EX}prop{k}"), ox.Literal(f"value {i} {k}"), g))
    store.extend(batch)
    return store


def insert_data_requests(n: int, persons: int) -> list[str]:
    out = []
    for r in range(n):
        lines = [f'<{EX}new/{r}> <{EX}prop{k}> "fresh {r} {k}" .' for k in range(8)]
        i = (r * 7) % persons  # two triples that are already in the store
        lines += [f'<{EX}person/{i}> <{EX}prop{k}> "value {i} {k}" .' for k in range(2)]
        out.append(f"INSERT DATA {{ GRAPH <{EX}graph/{i % GRAPHS}> {{ {' '.join(lines)} }} }}")
    return out


def modify_requests(n: int, groups: int) -> list[str]:
    return [
        f"""PREFIX ex: <{EX}>
DELETE {{ GRAPH ?g {{ ?s ex:status ?old }} }}
INSERT {{ GRAPH ?g {{ ?s ex:status "v{r + 1}" }} }}
WHERE {{ GRAPH ?g {{ ?s ex:group <{EX}group/{r % groups}> ; ex:status ?old }} }}"""
        for r in range(n)
    ]


def run(label: str, requests: list[str], quads: int, expect: Callable[[int], int]) -> None:
    ours, baseline = build(quads), build(quads)
    extractor = UpdateExtractor(ours)
    t0 = time.perf_counter()
    changed = 0
    for r, request in enumerate(requests):
        delta = extractor.apply(request)
        size = len(delta.inserted) + len(delta.deleted)
        if size != expect(r):
            raise SystemExit(f"{label}: request {r} changed {size} quads, expected {expect(r)}")
        changed += size
    ours_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for request in requests:
        baseline.update(request)
    base_s = time.perf_counter() - t0
    if len(ours) != len(baseline):
        raise SystemExit(f"{label}: store sizes differ ({len(ours)} vs {len(baseline)})")
    n = len(requests)
    print(
        f"{label:12s} store={quads:>7} requests={n:>5}  {n / ours_s:8.0f} req/s  {changed / ours_s:9.0f} delta quads/s"
        f"  | Store.update alone {n / base_s:8.0f} req/s  (extraction costs {ours_s / base_s:4.1f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quads", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    persons = args.quads // 10
    run("insert-data", insert_data_requests(args.requests, persons), args.quads, lambda r: 8)
    run("modify", modify_requests(args.requests, persons // 10), args.quads, lambda r: 20)
    copies = [f"COPY <{EX}graph/{r % GRAPHS}> TO <{EX}graph/{(r + 1) % GRAPHS}>" for r in range(GRAPHS - 1)]
    run("copy", copies, args.quads, lambda r: 2 * args.quads // GRAPHS)


if __name__ == "__main__":
    main()
