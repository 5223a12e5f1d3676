"""The engine benchmark: LSBench-style insert/delete streams, five query classes, three systems.

Usage:
  .venv/bin/python bench/engine_bench.py [--data DIR] [--repeat 3] [--oxigraph-seconds 8]
                                         [--pathway-batch 1000] [--classes star,path,...]

Replays one stream (`bench/lsbench.py`: the LSBench files in --data when present, otherwise the
deterministic generator; the static graph, then the post/photo/like streams with ~20% of all
triples deleted after their insertion) against the queries of `bench/queries/*.rq`, grouped by
class (file-name prefix: star, path, cycle, snowflake, loose) and all at once (mix), on:

1. cbgp.engine.engine.Engine, terms pre-encoded to ids (parse + encode measured separately):
   updates/s (best of --repeat runs, with the spread), peak RSS of the worker process, and state
   bytes per relevant triple (tracemalloc around replaying the stream into a fresh engine, in a
   separate untimed pass, divided by the triples present at the end that match some pattern of
   the registered queries).
2. pyoxigraph re-evaluation per update (SEPA's SPUNaive: re-run the query, diff against the last
   answers), gated like SEPA's LUTT (only updates whose predicate occurs in the query trigger a
   re-run).  The static graph is bulk-loaded untimed, then the stream is replayed for at most
   --oxigraph-seconds per class; its answer count at that point is checked against the engine's
   on the same prefix.
3. pathway 0.33.0 (if bench/setup.sh installed it): each BGP as a chain of joins over one table of
   triples fed with +1/-1 diffs, --pathway-batch updates per (even) timestamp, one worker thread;
   every output change is delivered to a Python callback, as the engine delivers its deltas.
   Its final answer counts are checked against the engine's.

Every system runs in its own subprocess (the peak RSS is per system and class; pathway runs from
its own venv).  No assertion is made on timings: the figures are printed for the README.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from collections import Counter
from pathlib import Path
from typing import Any, Iterable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
QUERY_DIR = HERE / "queries"
PATHWAY_VENV = Path(os.environ.get("PATHWAY_VENV", HERE / "out" / "pathway-venv"))
CLASSES = ("star", "path", "cycle", "snowflake", "loose")
GOAL_STAR_UPS = 250_000
GOAL_VS_PATHWAY = 3.0
GOAL_BYTES = 300

Update = tuple[int, int, int, int]


# --- shared helpers (also used by the pathway worker, which has no cbgp: keep them stdlib-only) ---


def peak_rss_mb() -> float:
    """This process's peak RSS.  VmHWM, not getrusage: ru_maxrss survives exec on Linux, so a worker
    would report its parent's peak (the parent holds the whole parsed dataset)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def read_stream(workdir: Path) -> tuple[list[Update], dict[str, Any]]:
    """The encoded stream as (op, s, p, o) tuples of ids, ints shared through one id table."""
    meta = json.loads((workdir / "meta.json").read_text())
    flat = array("q")
    with open(workdir / "stream.bin", "rb") as f:
        flat.frombytes(f.read())
    # One int object per id (like a TermDictionary's), so the state holds references, not copies.
    ids = list(range(meta["n_terms"] + 1))
    ups = [(flat[i], ids[flat[i + 1]], ids[flat[i + 2]], ids[flat[i + 3]]) for i in range(0, len(flat), 4)]
    return ups, meta


def emit(result: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(result), flush=True)


# --- preparation (parent) -------------------------------------------------------------------------


def query_files(classes: Iterable[str]) -> dict[str, list[Path]]:
    files = sorted(QUERY_DIR.glob("*.rq"))
    out = {c: [f for f in files if f.stem.split("_")[0] == c] for c in classes}
    return {c: fs for c, fs in out.items() if fs}


def prepare(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Load or generate, schedule deletions, measure parse + encode, write the encoded stream."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))
    import lsbench
    from cbgp.inputs.formats import InputError, parse_ntriples
    from cbgp.terms import TermDictionary

    start = time.perf_counter()
    data_dir = Path(args.data) if args.data else lsbench.DEFAULT_DATA
    dataset = lsbench.load_or_generate(data_dir, users=args.users)
    stream = lsbench.build_updates(dataset, delete_fraction=args.delete_fraction)
    load_seconds = time.perf_counter() - start

    # Parse cost on the product's input path: the updates as N-Triples lines through parse_ntriples
    # (inserts and deletes parse alike; the sign comes from the message, not the text).  A sample
    # of the stream is enough for a rate and keeps the run short.
    sample = stream.updates[: args.parse_sample]
    text = "".join(f"{s} {p} {o} .\n" for _, s, p, o in sample)
    start = time.perf_counter()
    parsed = 0
    for item in parse_ntriples(text):
        if isinstance(item, InputError):
            raise SystemExit(f"generated N-Triples do not parse: {item}")
        parsed += 1
    parse_seconds = time.perf_counter() - start
    assert parsed == len(sample)
    del text

    dictionary = TermDictionary()
    encode = dictionary.encode
    start = time.perf_counter()
    flat = array("q")
    for op, s, p, o in stream.updates:
        flat.extend((op, encode(s), encode(p), encode(o)))
    encode_seconds = time.perf_counter() - start

    with open(workdir / "stream.bin", "wb") as f:
        flat.tofile(f)
    terms = [""] * (len(dictionary) + 1)
    for term, term_id in dictionary.items():
        terms[term_id] = term
    # Canonical N-Triples terms escape newlines, so one term per line is unambiguous.
    (workdir / "terms.txt").write_text("\n".join(terms[1:]) + "\n", encoding="utf-8")
    meta = {
        "source": stream.source,
        "n_terms": len(dictionary),
        "n_static": stream.n_static,
        "stats": stream.stats,
        "load_seconds": load_seconds,
        "turtle_parse_seconds": dataset.parse_seconds,
        "parse_seconds": parse_seconds,
        "parse_updates": len(sample),
        "encode_seconds": encode_seconds,
    }
    (workdir / "meta.json").write_text(json.dumps(meta))
    return meta


def load_dictionary(workdir: Path):  # noqa: ANN201 - cbgp.terms.TermDictionary
    from cbgp.terms import TermDictionary

    dictionary = TermDictionary()
    with open(workdir / "terms.txt", encoding="utf-8") as f:
        for term_id, line in enumerate(f, 1):
            dictionary.add(term_id, line.rstrip("\n"))
    return dictionary


# --- worker: the engine -------------------------------------------------------------------------


def relevant_triples(present: set[tuple[int, int, int]], patterns: list[tuple[int | None, int, int | None]]) -> int:
    """Triples present that match at least one pattern (None = variable position)."""
    by_predicate: dict[int, list[tuple[int | None, int | None]]] = {}
    for s, p, o in patterns:
        by_predicate.setdefault(p, []).append((s, o))
    count = 0
    for s, p, o in present:
        for ps, po in by_predicate.get(p, ()):
            if (ps is None or ps == s) and (po is None or po == o):
                count += 1
                break
    return count


def engine_patterns(engine, dictionary) -> list[tuple[int | None, int, int | None]]:  # noqa: ANN001
    """The (s, p, o) id patterns of every registered query; a variable or an unknown term is None."""
    out = []
    for registered in engine.queries.values():
        for t in registered.plan.query.patterns:
            def term(x: str) -> int | None:
                return None if x.startswith("?") else dictionary.encode(x)
            p = term(t.p)
            assert p is not None, "variable predicates are outside the BGP fragment the engine indexes"
            out.append((term(t.s), p, term(t.o)))
    return out


def replay(engine, ups: list[Update]) -> dict[str, int]:  # noqa: ANN001
    """Apply every update; return each query's final answer count (sum of delta signs)."""
    apply = engine.apply
    counts: dict[str, int] = {name: 0 for name in engine.queries}
    for op, s, p, o in ups:
        out = apply(op, s, p, o)
        if out:
            for name, sign, _row in out:
                counts[name] += sign
    return counts


def worker_engine(workdir: Path, query_paths: list[Path], repeat: int) -> None:
    sys.path.insert(0, str(ROOT))
    import tracemalloc

    from cbgp.engine.engine import Engine

    ups, _meta = read_stream(workdir)
    dictionary = load_dictionary(workdir)
    texts = {p.stem: p.read_text() for p in query_paths}
    rss_input = peak_rss_mb()

    def fresh() -> Engine:
        engine = Engine(dictionary)
        for name, text in texts.items():
            engine.register(name, text)
        return engine

    seconds: list[float] = []
    counts: dict[str, int] = {}
    entries = 0
    for _ in range(repeat):
        engine = fresh()
        gc.collect()
        start = time.perf_counter()
        counts = replay(engine, ups)
        seconds.append(time.perf_counter() - start)
        entries = engine.state_entries()
        del engine
    rss_peak = peak_rss_mb()

    # State size: a separate, untimed pass (tracemalloc slows every allocation).
    engine = fresh()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    replay(engine, ups)
    gc.collect()
    state_bytes = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()

    present: set[tuple[int, int, int]] = set()
    for op, s, p, o in ups:
        if op > 0:
            present.add((s, p, o))
        else:
            present.discard((s, p, o))
    relevant = relevant_triples(present, engine_patterns(engine, dictionary))
    emit({
        "system": "engine",
        "updates": len(ups),
        "seconds": seconds,
        "rss_input_mb": rss_input,
        "rss_peak_mb": rss_peak,
        "state_bytes": state_bytes,
        "state_entries": entries,
        "relevant": relevant,
        "answers": counts,
    })


def worker_profile(workdir: Path, query_paths: list[Path], top: int) -> None:
    """cProfile of one replay: where the engine spends its time for these queries."""
    sys.path.insert(0, str(ROOT))
    import cProfile
    import pstats

    from cbgp.engine.engine import Engine

    ups, _meta = read_stream(workdir)
    engine = Engine(load_dictionary(workdir))
    for p in query_paths:
        engine.register(p.stem, p.read_text())
    profiler = cProfile.Profile()
    profiler.enable()
    replay(engine, ups)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


# --- worker: pyoxigraph re-evaluation per update (SEPA SPUNaive) ---------------------------------


def worker_oxigraph(workdir: Path, query_paths: list[Path], budget: float) -> None:
    sys.path.insert(0, str(ROOT))
    import pyoxigraph as ox

    from cbgp.engine.engine import Engine
    from cbgp.query.sparql import parse_query
    from cbgp.terms import to_oxigraph

    ups, meta = read_stream(workdir)
    dictionary = load_dictionary(workdir)
    n_static = meta["n_static"]
    cache: dict[int, Any] = {}

    def term(term_id: int):  # noqa: ANN202
        found = cache.get(term_id)
        if found is None:
            found = cache[term_id] = to_oxigraph(dictionary.decode(term_id))
        return found

    def quad(s: int, p: int, o: int) -> ox.Quad:
        return ox.Quad(term(s), term(p), term(o), ox.DefaultGraph())

    texts = {p.stem: p.read_text() for p in query_paths}
    # SEPA's LUTT-style gate: an update can only change a query whose patterns use its predicate.
    gates = {name: {dictionary.encode(t.p) for t in parse_query(text).patterns} for name, text in texts.items()}

    store = ox.Store()
    store.bulk_extend([quad(s, p, o) for op, s, p, o in ups[:n_static] if op > 0])

    def evaluate(text: str) -> Counter:
        return Counter(tuple(str(v) for v in solution) for solution in store.query(text))

    last = {name: evaluate(text) for name, text in texts.items()}
    deltas = 0
    done = n_static
    start = time.perf_counter()
    deadline = start + budget
    for op, s, p, o in ups[n_static:]:
        q = quad(s, p, o)
        if op > 0:
            store.add(q)
        else:
            store.remove(q)
        for name, text in texts.items():
            if p in gates[name]:
                now = evaluate(text)
                deltas += sum(((now - last[name]) + (last[name] - now)).values())
                last[name] = now
        done += 1
        if (done - n_static) % 16 == 0 and time.perf_counter() > deadline:
            break
    seconds = time.perf_counter() - start
    answers = {name: sum(c.values()) for name, c in last.items()}

    engine = Engine(dictionary)
    for name, text in texts.items():
        engine.register(name, text)
    engine_answers = replay(engine, ups[:done])
    emit({
        "system": "oxigraph",
        "updates": done - n_static,
        "prefix": done,
        "seconds": [seconds],
        "rss_peak_mb": peak_rss_mb(),
        "answers": answers,
        "engine_answers_on_prefix": engine_answers,
        "deltas": deltas,
    })


# --- worker: pathway (runs under the pathway venv's python; no cbgp there) -----------------------


def worker_pathway(workdir: Path, job_path: Path) -> None:
    import numpy as np
    import pandas as pd
    import pathway as pw

    job = json.loads(job_path.read_text())
    flat = np.fromfile(workdir / "stream.bin", dtype=np.int64).reshape(-1, 4)
    batch = job["batch"]
    # Row identity: deletes must retract the row their insert added, so a triple keeps one id.
    _, row_ids = np.unique(flat[:, 1:], axis=0, return_inverse=True)
    row_ids = row_ids.reshape(-1)
    df = pd.DataFrame({
        "s": flat[:, 1], "p": flat[:, 2], "o": flat[:, 3],
        "__time__": 2 * (np.arange(len(flat)) // batch) + 2,  # pathway wants even timestamps
        "__diff__": flat[:, 0],
    }, index=row_ids)
    build_start = time.perf_counter()
    triples = pw.debug.table_from_pandas(df)
    print(f"pathway: table built in {time.perf_counter() - build_start:.1f} s", file=sys.stderr)
    counts: dict[str, int] = {}
    changes: dict[str, int] = {}

    def pattern_table(pattern: dict[str, Any]) -> tuple[pw.Table, list[str]]:
        cond = triples.p == pattern["p"]
        for pos in ("s", "o"):
            if pattern[pos + "_const"] is not None:
                cond = cond & (triples[pos] == pattern[pos + "_const"])
        if pattern["s_var"] is not None and pattern["s_var"] == pattern["o_var"]:
            cond = cond & (triples.s == triples.o)
        t = triples.filter(cond)
        cols: dict[str, Any] = {"_k": 0}  # a constant join key for cartesian products of parts
        for pos in ("s", "o"):
            if pattern[pos + "_var"] is not None:
                cols[pattern[pos + "_var"]] = t[pos]
        return t.select(**cols), [c for c in cols if c != "_k"]

    for name, patterns in job["queries"].items():
        remaining = list(patterns)
        acc, acc_vars = pattern_table(remaining.pop(0))
        while remaining:
            # Join next a pattern sharing a variable with what is joined so far (else a product).
            index = next((i for i, pt in enumerate(remaining)
                          if {pt["s_var"], pt["o_var"]} & set(acc_vars)), 0)
            right, right_vars = pattern_table(remaining.pop(index))
            shared = [v for v in right_vars if v in acc_vars]
            conditions = [acc[v] == right[v] for v in shared] or [acc._k == right._k]
            new_vars = [v for v in right_vars if v not in acc_vars]
            acc = acc.join(right, *conditions).select(
                _k=pw.left._k, **{v: pw.left[v] for v in acc_vars}, **{v: pw.right[v] for v in new_vars})
            acc_vars += new_vars
        counts[name] = 0
        changes[name] = 0

        def on_change(key, row, time, is_addition, _name=name):  # noqa: ANN001
            counts[_name] += 1 if is_addition else -1
            changes[_name] += 1

        pw.io.subscribe(acc, on_change=on_change)
    start = time.perf_counter()
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    end = time.perf_counter()
    emit({
        "system": "pathway",
        "version": pw.__version__,
        "updates": len(flat),
        "seconds": [end - start],
        "seconds_with_build": end - build_start,
        "batch": batch,
        "rss_peak_mb": peak_rss_mb(),
        "answers": counts,
        "changes": changes,
    })


def pathway_job(name: str, query_paths: list[Path], workdir: Path, batch: int, dictionary) -> Path:  # noqa: ANN001
    """Queries as id patterns for the pathway worker (it cannot import cbgp)."""
    from cbgp.query.sparql import parse_query

    queries = {}
    for path in query_paths:
        patterns = []
        for t in parse_query(path.read_text()).patterns:
            def var(x: str) -> str | None:
                return "v_" + x.lstrip("?").replace(":", "_") if x.startswith("?") else None

            def const(x: str) -> int | None:
                return None if x.startswith("?") else dictionary.encode(x)
            patterns.append({"p": dictionary.encode(t.p), "s_var": var(t.s), "o_var": var(t.o),
                             "s_const": const(t.s), "o_const": const(t.o)})
        queries[path.stem] = patterns
    job = workdir / f"pathway-{name}.json"
    job.write_text(json.dumps({"batch": batch, "queries": queries}))
    return job


# --- parent: orchestration and the table --------------------------------------------------------


def run_worker(argv: list[str], python: str = sys.executable, timeout: float = 600) -> dict[str, Any] | None:
    proc = subprocess.run([python, str(Path(__file__).resolve()), *argv], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONHASHSEED": "0"})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    sys.stderr.write(f"worker {argv[:2]} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}\n")
    return None


def pathway_python() -> str | None:
    python = PATHWAY_VENV / "bin" / "python"
    if not python.exists():
        return None
    ok = subprocess.run([str(python), "-c", "import pathway"], capture_output=True).returncode == 0
    return str(python) if ok else None


def rate(result: dict[str, Any]) -> tuple[float, float, float]:
    """(best, worst, median) updates/s over the runs."""
    rates = sorted(result["updates"] / s for s in result["seconds"])
    return rates[-1], rates[0], rates[len(rates) // 2]


def fmt_rate(result: dict[str, Any] | None) -> str:
    if result is None:
        return "-"
    best, worst, _ = rate(result)
    if len(result["seconds"]) > 1:
        return f"{best:,.0f} ({worst:,.0f}-{best:,.0f})"
    return f"{best:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="LSBench output folder (default: shared LSBench-1000; generator if absent)")
    parser.add_argument("--users", type=int, default=1000, help="generator size when no data is found")
    parser.add_argument("--delete-fraction", type=float, default=0.2)
    parser.add_argument("--repeat", type=int, default=3, help="engine runs per class (best and spread)")
    parser.add_argument("--oxigraph-seconds", type=float, default=4.0, help="time budget per class")
    parser.add_argument("--pathway-batch", type=int, default=1000, help="updates per pathway timestamp")
    parser.add_argument("--parse-sample", type=int, default=200_000, help="updates timed through the parser")
    parser.add_argument("--classes", default=",".join((*CLASSES, "mix")))
    parser.add_argument("--systems", default="engine,oxigraph,pathway")
    parser.add_argument("--profile", metavar="CLASS", help="only cProfile the engine on CLASS and exit")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (encoded stream)")
    # Worker modes (internal).
    parser.add_argument("--worker", choices=("engine", "oxigraph", "pathway", "profile"), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--queries", help=argparse.SUPPRESS)
    parser.add_argument("--job", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        workdir = Path(args.workdir)
        paths = [Path(p) for p in args.queries.split(",")] if args.queries else []
        if args.worker == "engine":
            worker_engine(workdir, paths, args.repeat)
        elif args.worker == "oxigraph":
            worker_oxigraph(workdir, paths, args.oxigraph_seconds)
        elif args.worker == "profile":
            worker_profile(workdir, paths, 25)
        else:
            worker_pathway(workdir, Path(args.job))
        return

    sys.path.insert(0, str(ROOT))
    wanted = [c.strip() for c in args.classes.split(",") if c.strip()]
    systems = {s.strip() for s in args.systems.split(",")}
    groups = query_files(c for c in CLASSES if c in wanted or "mix" in wanted)
    classes = [c for c in CLASSES if c in wanted and c in groups]
    if "mix" in wanted:
        classes.append("mix")
        groups["mix"] = [p for c in CLASSES for p in groups.get(c, [])]

    out_dir = HERE / "out"
    out_dir.mkdir(exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="engine-bench-", dir=out_dir))
    try:
        meta = prepare(args, workdir)
        st = meta["stats"]
        n = st["updates"]
        print(f"stream: {meta['source']}")
        print(f"  {st['static_triples']:,} static + {st['stream_triples']:,} stream triples inserted "
              f"({st['duplicates_dropped']:,} duplicate inserts dropped), {st['deletes']:,} deleted "
              f"({st['deletes'] / st['inserts']:.0%}) -> {n:,} updates, {meta['n_terms']:,} terms")
        if meta["turtle_parse_seconds"]:
            print(f"  loading the LSBench Turtle files (cbgp.inputs.formats.parse_turtle): {meta['turtle_parse_seconds']:.1f} s")
        print(f"  parse (cbgp.inputs.formats.parse_ntriples, first {meta['parse_updates']:,} updates): "
              f"{meta['parse_updates'] / meta['parse_seconds']:,.0f} updates/s; "
              f"encode (TermDictionary): {n / meta['encode_seconds']:,.0f} updates/s "
              f"(both excluded from the engine figures below)")
        for c in classes:
            print(f"  {c}: " + ", ".join(p.stem for p in groups[c]))
        if args.profile:
            subprocess.run([sys.executable, __file__, "--worker", "profile", "--workdir", str(workdir),
                            "--queries", ",".join(str(p) for p in groups[args.profile])])
            return

        pw_python = pathway_python() if "pathway" in systems else None
        if "pathway" in systems and pw_python is None:
            print("pathway: not installed (run `bash bench/setup.sh`: pathway==0.33.0 into "
                  f"{PATHWAY_VENV.relative_to(ROOT)}, ~1.5 min)")
        dictionary = load_dictionary(workdir) if pw_python else None

        results: dict[tuple[str, str], dict[str, Any] | None] = {}
        t0 = time.perf_counter()
        for c in classes:
            qarg = ",".join(str(p) for p in groups[c])
            base = ["--workdir", str(workdir), "--queries", qarg]
            if "engine" in systems:
                results[("engine", c)] = run_worker(["--worker", "engine", *base, "--repeat", str(args.repeat)])
            if "oxigraph" in systems:
                results[("oxigraph", c)] = run_worker(
                    ["--worker", "oxigraph", *base, "--oxigraph-seconds", str(args.oxigraph_seconds)])
            if pw_python:
                job = pathway_job(c, groups[c], workdir, args.pathway_batch, dictionary)
                results[("pathway", c)] = run_worker(["--worker", "pathway", "--workdir", str(workdir),
                                                      "--job", str(job)], python=pw_python)
            print(f"  ... {c} done at {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        print_table(classes, results, n, args)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"work folder kept: {workdir}")


def print_table(classes: list[str], results: dict[tuple[str, str], dict[str, Any] | None], n: int,
                args: argparse.Namespace) -> None:
    header = ("system", "class", "updates", "updates/s best (spread)", "peak RSS MB", "B/relevant triple",
              "answers (final)")
    rows: list[tuple[str, ...]] = []
    for system in ("engine", "oxigraph", "pathway"):
        for c in classes:
            if (system, c) not in results:
                continue
            r = results[(system, c)]
            if r is None:
                rows.append((system, c, "-", "failed", "-", "-", "-"))
                continue
            answers = sum(r["answers"].values())
            per_triple = "-"
            if system == "engine":
                per_triple = f"{r['state_bytes'] / max(1, r['relevant']):,.0f} ({r['relevant']:,} tr)"
            label = {"engine": "cbgp engine", "oxigraph": "pyoxigraph re-eval",
                     "pathway": f"pathway {r.get('version', '')}"}[system]
            updates = f"{r['updates']:,}"
            if system == "oxigraph":
                updates += " *"
                eng = sum(r["engine_answers_on_prefix"].values())
                same = "=" if r["engine_answers_on_prefix"] == r["answers"] else "!="
                answers_text = f"{answers:,} {same} engine {eng:,} on prefix"
            elif system == "pathway":
                engine_result = results.get(("engine", c))
                if engine_result is not None:
                    same = "=" if engine_result["answers"] == r["answers"] else "!="
                    answers_text = f"{answers:,} {same} engine {sum(engine_result['answers'].values()):,}"
                else:
                    answers_text = f"{answers:,}"
            else:
                answers_text = f"{answers:,}"
            rows.append((label, c, updates, fmt_rate(r), f"{r['rss_peak_mb']:,.0f}", per_triple, answers_text))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print()
    print(line)
    print("-" * len(line))
    for row in rows:
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)))
    print()
    print("* pyoxigraph: static graph bulk-loaded untimed, then the stream replayed for "
          f"<= {args.oxigraph_seconds:g} s per class, each update re-running every query that uses its predicate.")
    print(f"pathway: {args.pathway_batch} updates per timestamp, 1 worker, every output change to a Python "
          "callback; its time is pw.run() (table building excluded).")
    first = next((results[("engine", c)] for c in classes if results.get(("engine", c))), None)
    if first:
        print(f"peak RSS is per worker process; an engine worker holds {first['rss_input_mb']:.0f} MB "
              "(interpreter, dictionary, encoded stream) before building any state.")
    print()
    print("goals:")
    star = results.get(("engine", "star"))
    if star:
        best = rate(star)[0]
        print(f"  engine >= {GOAL_STAR_UPS:,} updates/s on star queries: {best:,.0f} "
              f"-> {'met' if best >= GOAL_STAR_UPS else 'NOT met'}")
    for c in classes:
        e, p = results.get(("engine", c)), results.get(("pathway", c))
        if e and p:
            ratio = rate(e)[0] / rate(p)[0]
            print(f"  engine >= {GOAL_VS_PATHWAY:g}x pathway, {c}: {ratio:.1f}x "
                  f"-> {'met' if ratio >= GOAL_VS_PATHWAY else 'NOT met'}")
    if not any(s == "pathway" for s, _ in results):
        print(f"  engine >= {GOAL_VS_PATHWAY:g}x pathway: not measured (pathway not installed)")
    for c in classes:
        e = results.get(("engine", c))
        if e:
            b = e["state_bytes"] / max(1, e["relevant"])
            print(f"  state <= {GOAL_BYTES} B per relevant triple, {c}: {b:,.0f} "
                  f"-> {'met' if b <= GOAL_BYTES else 'NOT met'}")


if __name__ == "__main__":
    main()
