"""Property paths on the LSBench stream: the continuous engine against pyoxigraph re-evaluating after every update.

Usage:
  .venv/bin/python bench/paths.py [--updates 150000] [--sample 300] [--repeat 3] [--data DIR]
  .venv/bin/python bench/paths.py --together 1,10,50 [--updates 150000] [--repeat 3] [--data DIR]

Queries (constants drawn from the stream: the best-connected user, and a least-connected one whose friendships
the stream never deletes):

- reach_hub, reach_low:  <U> foaf:knows+ ?y                   reachability over friendships from a user
- reached:               ?x foaf:knows+ <U>                   who reaches a user (anchored at the object)
- items:                 ?x rdf:type/rdfs:subClassOf* sioc:Item   a class hierarchy: the stream's items, over a
                         small SIOC/SIB class hierarchy published before the stream (10 rdfs:subClassOf triples)
- friends_posts:         <U> foaf:knows/sioc:creator_of ?post  a sequence (a plain join)

For each query alone, `--repeat` times: the engine over all `--updates` (updates/s, the state it keeps, the time
of each deletion of a friendship), then the cut: the low user's friendships deleted one by one after the stream,
the last one cutting every path from (or to) it.  pyoxigraph holds the same graph and re-evaluates the query
after each of `--sample` updates in the middle of the stream (its updates/s: one store change plus one
evaluation).  Exactness: our answers rebuilt from the deltas equal pyoxigraph's after every update of the sample
and every tenth of the stream.  No assertion on timings: docs/benchmarks.md quotes the output.

``--together N,...``: N reachability queries ``<U> foaf:knows+ ?y`` registered at once in one engine (U: the N
best-connected users), the stream applied once: updates/s, the CPU each friendship change costs per query, and
the state (the engine's, its one copy of the friendships included).  The queries share the engine's copy of the
steps and each keeps its own tree, so this shows what many anchored closures over one relation cost side by side.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import lsbench  # noqa: E402
import pyoxigraph as ox  # noqa: E402

from cbgp.algebra import ContinuousEngine  # noqa: E402
from cbgp.algebra.paths import Closure, closure_pairs  # noqa: E402
from cbgp.terms import from_oxigraph, to_oxigraph  # noqa: E402

KNOWS = f"<{lsbench.FOAF}knows>"
REPLY = f"<{lsbench.SIOC}reply_of>"
CREATOR = f"<{lsbench.SIOC}creator_of>"


SUB = lsbench.SUBCLASS_OF
ONTOLOGY = lsbench.CLASS_HIERARCHY


def make_queries(updates: list) -> tuple[dict[str, str], str]:
    """The queries, and the low user (whose friendships the cut deletes)."""
    degree = Counter(s for diff, s, p, _o in updates if p == KNOWS and diff > 0)
    deleted = {s for diff, s, p, _o in updates if p == KNOWS and diff < 0} | \
        {o for diff, _s, p, o in updates if p == KNOWS and diff < 0}
    hub = degree.most_common(1)[0][0]
    low = min((user for user in degree if user not in deleted and degree[user] >= 2), key=lambda u: (degree[u], u))
    item = f"<{lsbench.SIOC}Item>"
    return {
        "reach_hub": f"SELECT ?y WHERE {{ {hub} {KNOWS}+ ?y }}",
        "reach_low": f"SELECT ?y WHERE {{ {low} {KNOWS}+ ?y }}",
        "reached": f"SELECT ?x WHERE {{ ?x {KNOWS}+ {low} }}",
        "items": f"SELECT ?x WHERE {{ ?x a/{SUB}* {item} }}",
        "friends_posts": f"SELECT ?post WHERE {{ {hub} {KNOWS}/{CREATOR} ?post }}",
    }, low


def _quad(s: str, p: str, o: str) -> ox.Quad:
    return ox.Quad(to_oxigraph(s), to_oxigraph(p), to_oxigraph(o), ox.DefaultGraph())


def oracle_rows(store: ox.Store, text: str) -> Counter:
    solutions = store.query(text)
    names = [v.value for v in solutions.variables]
    return Counter(tuple(from_oxigraph(row[n]) if row[n] is not None else None for n in names) for row in solutions)


def closure_size(engine: ContinuousEngine, names: list[str]) -> tuple[int, int]:
    """The pairs the closures of the queries ``names`` hold, and the steps they read: their own, and the
    engine's shared copies (each counted once)."""
    ops = [engine.operator_queries[name] for name in names]
    own = sum(x.steps for op in ops for x in op.root.walk() if isinstance(x, Closure))
    return sum(closure_pairs(op.root) or 0 for op in ops), own + sum(s.size for s in engine.steps.values())


def run_engine(updates: list, name: str, text: str, low: str) -> dict:
    """The engine with ``text`` alone over ``updates``: seconds, state, each friendship deletion's time; then
    the cut of ``low``'s friendships."""
    engine = ContinuousEngine()
    engine.register(name, text)
    deletions: list[tuple[float, int]] = []
    started = time.perf_counter()
    clock = time.perf_counter
    for diff, s, p, o in updates:
        if diff < 0 and p == KNOWS:
            t0 = clock()
            deltas = engine.apply_terms(diff, s, p, o)
            deletions.append((clock() - t0, len(deltas)))
        else:
            engine.apply_terms(diff, s, p, o)
    seconds = time.perf_counter() - started
    pairs, steps = closure_size(engine, [name])
    times = sorted(t for t, _ in deletions) or [0.0]
    state = engine.state_entries()
    present: dict = {}
    for diff, s, p, o in updates:
        if p == KNOWS and low in (s, o):
            present[(s, o)] = diff > 0
    cut = []
    for (s, o), there in sorted(present.items()):
        if there:
            t0 = time.perf_counter()
            deltas = engine.apply_terms(-1, s, KNOWS, o)
            cut.append((time.perf_counter() - t0, sum(1 for _n, sign, _r in deltas if sign < 0)))
    if name in ("reach_low", "reached"):  # after the cut nothing reaches, or is reached from, the low user
        left = closure_size(engine, [name])[0]
        if left:
            raise SystemExit(f"{name}: {left} closure pairs left after the cut")
    slowest = max(cut, default=(0.0, 0))
    cutting = max(cut, key=lambda c: c[1], default=(0.0, 0))  # the deletion that retracts most
    return {"seconds": seconds, "updates_per_s": len(updates) / seconds, "state_entries": state,
            "closure_pairs": pairs, "closure_steps": steps, "deletions": len(deletions),
            "deletion_us_p50": 1e6 * times[len(times) // 2], "deletion_us_p99": 1e6 * times[int(len(times) * .99)],
            "deletion_us_max": 1e6 * times[-1], "cut_deletions": len(cut), "cut_us_max": 1e6 * slowest[0], "cutting_us": 1e6 * cutting[0],
            "cutting_retracts": cutting[1]}


def run_oracle(updates: list, name: str, text: str, start: int, sample: int) -> dict:
    """pyoxigraph re-evaluating ``text`` after each update of ``updates[start:start+sample]``, and the engine's
    answers compared with it there and at every tenth of the stream."""
    store = ox.Store()
    engine = ContinuousEngine()
    current: Counter = Counter()
    for _n, sign, row in engine.register(name, text):
        current[row] += sign
    checks = {len(updates) * k // 10 for k in range(1, 11)}
    update_s = evaluate_s = 0.0
    compared = 0
    for index, (diff, s, p, o) in enumerate(updates, 1):
        in_sample = start < index <= start + sample
        t0 = time.perf_counter()
        (store.add if diff > 0 else store.remove)(_quad(s, p, o))
        t1 = time.perf_counter()
        for _n, sign, row in engine.apply_terms(diff, s, p, o):
            current[row] += sign
        if in_sample or index in checks:
            t2 = time.perf_counter()
            want = oracle_rows(store, text)
            t3 = time.perf_counter()
            got = Counter({tuple(engine.dictionary.decode(t) if t is not None else None for t in row): n
                           for row, n in current.items() if n})
            if got != want:
                raise SystemExit(f"{name}: answers differ from pyoxigraph after update {index} {(diff, s, p, o)}")
            compared += 1
            if in_sample:
                update_s += t1 - t0
                evaluate_s += t3 - t2
    per_update = (update_s + evaluate_s) / sample
    return {"updates_per_s": 1 / per_update, "evaluate_ms": 1e3 * evaluate_s / sample, "compared": compared,
            "answers": sum(current.values())}


def run_together(updates: list, count: int) -> dict:
    """``count`` anchored reachability queries in one engine over ``updates``: seconds, state, pairs."""
    degree = Counter(s for diff, s, p, _o in updates if p == KNOWS and diff > 0)
    engine = ContinuousEngine()
    names = [f"reach{i}" for i in range(count)]
    for name, (user, _n) in zip(names, degree.most_common(count)):
        engine.register(name, f"SELECT ?y WHERE {{ {user} {KNOWS}+ ?y }}")
    started = time.perf_counter()
    for diff, s, p, o in updates:
        engine.apply_terms(diff, s, p, o)
    seconds = time.perf_counter() - started
    pairs, steps = closure_size(engine, names)
    return {"seconds": seconds, "updates_per_s": len(updates) / seconds, "state_entries": engine.state_entries(),
            "closure_pairs": pairs, "closure_steps": steps}


def main_together(updates: list, counts: list[int], repeat: int) -> None:
    changes = sum(1 for _d, _s, p, _o in updates if p == KNOWS)
    results = {}
    for count in counts:
        runs = [run_together(updates, count) for _ in range(repeat)]
        seconds = statistics.median(r["seconds"] for r in runs)
        rates = [r["updates_per_s"] for r in runs]
        per_change = 1e6 * seconds / changes / count
        results[count] = {"runs": runs, "us_per_friendship_change_per_query": per_change}
        print(f"{count:4} queries together: {statistics.median(rates):9,.0f} updates/s "
              f"[{min(rates):,.0f}-{max(rates):,.0f}], {per_change:.1f} us per friendship change per query "
              f"({changes:,} changes), state {runs[-1]['state_entries']:,} entries "
              f"({runs[-1]['closure_pairs']:,} closure pairs over {runs[-1]['closure_steps']:,} steps)", flush=True)
    print(json.dumps({"updates": len(updates), "together": results}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=150_000)
    parser.add_argument("--sample", type=int, default=300, help="updates re-evaluated by pyoxigraph")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--data", default=None, help="LSBench directory (default: ../shared/data/lsbench-1000)")
    parser.add_argument("--together", default=None, metavar="N,...",
                        help="instead: N anchored reachability queries registered at once, for each N given")
    args = parser.parse_args()

    dataset = lsbench.load_or_generate(Path(args.data) if args.data else lsbench.DEFAULT_DATA)
    stream = lsbench.build_updates(dataset)
    updates = ONTOLOGY + stream.updates[: args.updates]
    if args.together:
        main_together(updates, [int(n) for n in args.together.split(",")], args.repeat)
        return
    queries, low = make_queries(updates)
    print(f"{len(updates):,} updates ({dataset.source}), "
          f"{sum(1 for d, _s, p, _o in updates if p == KNOWS and d < 0):,} friendship deletions", flush=True)
    start = (len(ONTOLOGY) + stream.n_static + len(updates)) // 2  # the middle of what follows the static data
    if start + args.sample > len(updates):
        raise SystemExit(f"--updates {args.updates:,} leaves no sample after the {stream.n_static:,} static triples")
    results: dict[str, dict] = {}
    for name, text in queries.items():
        ours = [run_engine(updates, name, text, low) for _ in range(args.repeat)]
        oracle = run_oracle(updates, name, text, start, args.sample)
        rates = [r["updates_per_s"] for r in ours]
        median = statistics.median(rates)
        results[name] = {"ours": ours, "pyoxigraph": oracle, "speedup": median / oracle["updates_per_s"]}
        last = ours[-1]
        print(f"{name:14} ours {median:9,.0f} updates/s [{min(rates):,.0f}-{max(rates):,.0f}]  "
              f"pyoxigraph {oracle['updates_per_s']:7,.0f}/s ({oracle['evaluate_ms']:.2f} ms a query)  "
              f"x{results[name]['speedup']:,.0f}  state {last['state_entries']:,} entries "
              f"({last['closure_pairs']:,} closure pairs over {last['closure_steps']:,} steps), {oracle['answers']:,} answers; "
              f"friendship deletion "
              f"p50 {last['deletion_us_p50']:.0f} us, p99 {last['deletion_us_p99']:.0f} us, "
              f"max {last['deletion_us_max']:.0f} us; the cut: {last['cut_deletions']} deletions, slowest "
              f"{last['cut_us_max']:,.0f} us, the one that retracts {last['cutting_retracts']:,} answers "
              f"{last['cutting_us']:,.0f} us; exact at {oracle['compared']} checks", flush=True)
    print(json.dumps({"updates": len(updates), "queries": queries, "results": results}))


if __name__ == "__main__":
    main()
