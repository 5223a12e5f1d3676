"""Cost of the continuous SPARQL operators per delta, and of FILTER push-down, on the LSBench stream.

Usage:
  .venv/bin/python bench/operators_bench.py [--data DIR] [--limit N] [--only NAME,...] [--repeat N]

The stream is `bench/lsbench.py`'s (the LSBench files in --data when present, else the generator): the static
graph, then the post/photo/like streams, with 20% of all triples deleted after their insertion.  Terms are
encoded up front.  For each query below:

- `bgp`: the query's BGP leaves alone in an `Engine` (what the operators sit on), seconds over the stream;
- `ops`: the whole operator query (`cbgp.algebra.OperatorQuery`), seconds over the same stream;
- per update: `ops` time / updates; per leaf delta: (`ops` - `bgp`) / the deltas the leaves produced, i.e. what
  the operators above the BGP cost for each solution change they receive;
- answers: delta answers emitted; state: entries held at the end (engine states + operator states) and the
  engine's approximate state bytes; terms kept: what the dictionary grew by over the stream, in terms and bytes
  (the values the operators computed and still hold, and those kept for good: a GROUP BY key's, and before they
  were freed once let go an aggregate's and a BIND's), after `collect()` per update as `cbgp replay` does.

Filter push-down is measured by running the FILTER queries twice, with and without it (`pushdown` column):
a pushed filter drops a change before the engine when every pattern it could match rejects it, so rejected
triples cost no star state.  Times are CPU seconds of this process (time.process_time: steadier than wall time on
a shared machine), the best of --repeat runs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import lsbench  # noqa: E402

from cbgp.algebra import OperatorQuery, OperatorQuerySpec, analyse  # noqa: E402
from cbgp.engine.engine import Engine  # noqa: E402
from cbgp.terms import DEFAULT_GRAPH_ID, TermDictionary  # noqa: E402

PREFIXES = """PREFIX rdf: <http://www.w3.org/1999/02/22-rdf-syntax-ns#>
PREFIX xsd: <http://www.w3.org/2001/XMLSchema#>
PREFIX foaf: <http://xmlns.com/foaf/0.1/>
PREFIX sioc: <http://rdfs.org/sioc/ns#>
PREFIX dc: <http://purl.org/dc/elements/1.1/>
PREFIX dbpprop: <http://dbpedia.org/property/>
PREFIX sib: <http://www.ins.cwi.nl/sib/vocabulary/>
PREFIX sibu: <http://www.ins.cwi.nl/sib/user/>
PREFIX ex: <http://example.org/>
"""

# name -> (operator measured, query, run with and without push-down)
QUERIES = {
    "filter_eq": ("FILTER =, one star variable",
                  'SELECT * WHERE { ?x sib:browser ?b ; sioc:ip_address ?ip . FILTER(?b = "Opera") }', True),
    "filter_date": ("FILTER dateTime range",
                    'SELECT * WHERE { ?x dc:created ?d ; sib:browser ?b . '
                    'FILTER(?d >= "2010-02-10T00:00:00Z"^^xsd:dateTime) }', True),
    "filter_regex": ("FILTER REGEX",
                     'SELECT * WHERE { ?x sioc:ip_address ?ip ; sib:browser ?b . FILTER(REGEX(?ip, "^1[0-2]\\\\.")) }',
                     True),
    "filter_fof": ("FILTER != of two variables",
                   "SELECT * WHERE { ?a foaf:knows ?b . ?b foaf:knows ?c FILTER(?a != ?c) }", False),
    "filter_number": ("FILTER numeric range and BOUND",
                      "SELECT * WHERE { ?p dbpprop:latd ?lat ; sib:browser ?b . OPTIONAL { ?p sib:hashtag ?t } "
                      "FILTER(?lat > 20 && ?lat <= 60 && !BOUND(?t)) }", False),
    "bind": ("BIND arithmetic", "SELECT * WHERE { ?p dbpprop:latd ?lat . BIND(ROUND(?lat) AS ?r) }", False),
    "optional": ("OPTIONAL (left join)",
                 "SELECT * WHERE { ?u foaf:knows ?f . OPTIONAL { ?f sib:interest ?i } }", False),
    "union": ("UNION", "SELECT * WHERE { { ?u sib:like ?x } UNION { ?u sioc:creator_of ?x } }", False),
    "minus": ("MINUS", "SELECT * WHERE { ?u foaf:knows ?f . MINUS { ?f foaf:knows ?u } }", False),
    "not_exists": ("FILTER NOT EXISTS",
                   "SELECT * WHERE { ?u sioc:creator_of ?p . FILTER NOT EXISTS { ?p sib:hashtag ?t } }", False),
    "count": ("GROUP BY + COUNT",
              "SELECT ?post (COUNT(?u) AS ?likes) WHERE { ?u sib:like ?post } GROUP BY ?post", False),
    "group_concat": ("GROUP_CONCAT + SUM per group",
                     "SELECT ?u (GROUP_CONCAT(STR(?post)) AS ?all) (SUM(?lat) AS ?s) WHERE { ?u sib:like ?post "
                     "OPTIONAL { ?post dbpprop:latd ?lat } } GROUP BY ?u", False),
    "having_distinct": ("COUNT DISTINCT + HAVING",
                        "SELECT ?u (COUNT(DISTINCT ?post) AS ?n) WHERE { ?u sib:like ?post } GROUP BY ?u "
                        "HAVING (COUNT(DISTINCT ?post) > 50)", False),
    "min_max_avg": ("MIN/MAX/AVG",
                    "SELECT ?b (MIN(?lat) AS ?lo) (MAX(?lat) AS ?hi) (AVG(?lat) AS ?avg) "
                    "WHERE { ?p dbpprop:latd ?lat ; sib:browser ?b } GROUP BY ?b", False),
    "distinct": ("SELECT DISTINCT", "SELECT DISTINCT ?b WHERE { ?x sib:browser ?b }", False),
    "topk": ("ORDER BY DESC LIMIT 10 (top-k)",
             "SELECT ?x ?d WHERE { ?x dc:created ?d } ORDER BY DESC(?d) LIMIT 10", False),
    "ask": ("ASK", 'ASK { ?u sib:like ?p . ?p sib:hashtag "Cher" }', False),
    "construct": ("CONSTRUCT", "CONSTRUCT { ?p ex:likedBy ?u } WHERE { ?u sib:like ?p }", False),
    "predicate_var": ("variable predicate (PatternLeaf) + COUNT",
                      "SELECT ?p (COUNT(*) AS ?n) WHERE { sibu:u31 ?p ?o } GROUP BY ?p", False),
}


def encode_stream(updates, dictionary: TermDictionary) -> list[tuple[int, int, int, int]]:  # noqa: ANN001
    encode = dictionary.encode
    return [(op, encode(s), encode(p), encode(o)) for op, s, p, o in updates]


def timed_apply(apply, stream) -> tuple[float, int]:  # noqa: ANN001
    """Every update of ``stream`` through ``apply``: CPU seconds, deltas it returned."""
    deltas = 0
    start = time.process_time()
    for op, s, p, o in stream:
        deltas += len(apply(op, s, p, o, DEFAULT_GRAPH_ID))
    return time.process_time() - start, deltas


def run_bgp(query: OperatorQuery, stream, dictionary: TermDictionary) -> tuple[float, int]:  # noqa: ANN001
    """The query's engine leaves alone: seconds, leaf deltas."""
    engine = Engine(dictionary)
    for number, leaf in enumerate(query.engine_leaves):
        engine.register(f"leaf{number}", leaf.query)
    return timed_apply(engine.apply, stream)


def run_ops(query: OperatorQuery, stream) -> tuple[float, int]:  # noqa: ANN001
    """The whole operator query: seconds, answer deltas (what it let go freed after each update)."""
    collect = getattr(query.terms.dictionary, "collect", None)
    if collect is None:  # (a tree before held terms)
        return timed_apply(query.apply, stream)

    def apply(*change: int) -> list:
        out = query.apply(*change)
        collect()
        return out
    return timed_apply(apply, stream)


def terms_kept(dictionary: TermDictionary, before: tuple[int, int]) -> str:
    """What ``dictionary`` grew by since ``before`` (:func:`dictionary_size`)."""
    count, size = dictionary_size(dictionary)
    return f"{count - before[0]:,} / {(size - before[1]) / 1024:,.0f} KB"


def dictionary_size(dictionary: TermDictionary) -> tuple[int, int]:
    held = getattr(dictionary, "_held", {})
    return (len(dictionary), sum(len(term) for term, _id in dictionary.items())
            + sum(len(entry[0]) for entry in held.values()))


def leaf_deltas(query: OperatorQuery) -> int:
    leaves = list(query.leaves.values()) + list(query.pattern_leaves)
    return sum(leaf.deltas_in for leaf in leaves)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(lsbench.DEFAULT_DATA))
    parser.add_argument("--limit", type=int, default=0, help="first N updates only (0: all)")
    parser.add_argument("--only", default="", help="comma-separated query names")
    parser.add_argument("--repeat", type=int, default=1, help="runs per row; the fastest is shown")
    args = parser.parse_args()
    dataset = lsbench.load_or_generate(Path(args.data))
    stream_rows = lsbench.build_updates(dataset).updates
    if args.limit:
        stream_rows = stream_rows[: args.limit]
    dictionary = TermDictionary()
    stream = encode_stream(stream_rows, dictionary)
    n = len(stream)
    print(f"stream: {dataset.source}, {n:,} updates ({sum(1 for u in stream if u[0] < 0):,} deletes)\n")
    names = [q for q in args.only.split(",") if q] or list(QUERIES)
    print("| query | operator | push-down | BGP only s | with operators s | µs/update | µs per leaf delta "
          "(operators) | leaf deltas | answers | state entries | engine state KB | changes dropped | terms kept |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        label, text, both = QUERIES[name]
        spec = analyse(PREFIXES + text)
        if not isinstance(spec, OperatorQuerySpec):  # a plain BGP SELECT: the engine's own path
            engine = Engine(dictionary)
            engine.register(name, spec)
            start = time.process_time()
            answers = sum(len(engine.apply(op, s, p, o, DEFAULT_GRAPH_ID)) for op, s, p, o in stream)
            seconds = time.process_time() - start
            print(f"| {name} | {label} (plain BGP: engine fast path) | - | {seconds:.2f} | {seconds:.2f} | "
                  f"{seconds / n * 1e6:.2f} | - | - | {answers:,} | {engine.state_entries():,} | "
                  f"{engine.state_bytes() / 1024:,.0f} | - | - |", flush=True)
            continue
        for pushdown in ((True, False) if both else (True,)):
            ops_seconds = bgp_seconds = float("inf")
            kept = None
            for _ in range(args.repeat):  # best of --repeat: the machine is shared
                query = OperatorQuery(spec, dictionary, pushdown=pushdown)
                query.initial()
                if pushdown or not both:
                    bgp_seconds = min(bgp_seconds, run_bgp(query, stream, dictionary)[0])
                before = dictionary_size(dictionary)
                seconds, answers = run_ops(query, stream)
                kept = kept or terms_kept(dictionary, before)  # (the first run's: a later one finds them there)
                ops_seconds = min(ops_seconds, seconds)
            deltas = leaf_deltas(query)
            # With push-down the engine sees fewer changes than the BGP-only run: no per-delta difference.
            per_delta_text = "gated" if both and pushdown else (
                f"{(ops_seconds - bgp_seconds) / deltas * 1e6:.1f}" if deltas else "-")
            flag = ("on" if pushdown else "off") if both else "-"
            print(f"| {name} | {label} | {flag} | {bgp_seconds:.2f} | {ops_seconds:.2f} | "
                  f"{ops_seconds / n * 1e6:.2f} | {per_delta_text} | {deltas:,} | {answers:,} | "
                  f"{query.state_entries():,} | {query.engine.state_bytes() / 1024:,.0f} | {query.gated:,} | "
                  f"{kept} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
