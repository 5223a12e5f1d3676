"""Many alert queries at once: `cbgp replay` with 1, and with N, queries on the same LSBench updates.

Usage:
  .venv/bin/python bench/many_queries.py [--updates 200000] [--queries 10000] [--repeat 2] [--data DIR]

A subscription service's load: thousands of users, each with their own alerts.  The queries are of four
shapes, with constants drawn from the stream (so that many of them answer):

- per tag:   a post with hashtag T, and its author         ?post sib:hashtag "T" . ?author sioc:creator_of ?post
- per user:  someone likes a post of user U                <U> sioc:creator_of ?post . ?liker sib:like ?post
- per post:  someone likes post P                          ?liker sib:like <P>
- user x tag: user U posts with hashtag T                  <U> sioc:creator_of ?post . ?post sib:hashtag "T"

in the proportions 528 / 1,000 / 932 / the rest (for 10,000 queries).  Each configuration runs `cbgp replay` in
its own process, alternated, --repeat times: wall seconds, peak RSS, deltas.  The one-query run takes the first
per-tag query.  No assertion on timings: the figures are printed for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import lsbench  # noqa: E402

PREFIXES = (f"PREFIX sib: <{lsbench.SIB}>\n"
            f"PREFIX sioc: <{lsbench.SIOC}>\n")
SHARES = {"tag": 528, "user": 1000, "post": 932}  # per 10,000; user x tag pairs take the rest


def write_updates(updates: list[tuple[int, str, str, str]], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for diff, s, p, o in updates:
            f.write(f"{'A' if diff > 0 else 'D'} {s} {p} {o} .\n")


def make_queries(updates: list[tuple[int, str, str, str]], n: int, seed: int = 5) -> list[tuple[str, str]]:
    """`n` (name, text) alert queries whose constants occur in `updates` (skewed as the stream is)."""
    rng = random.Random(seed)
    tag, creator, like = f"<{lsbench.SIB}hashtag>", f"<{lsbench.SIOC}creator_of>", f"<{lsbench.SIB}like>"
    tags = Counter(o for _, _, p, o in updates if p == tag)
    users = Counter(s for _, s, p, _ in updates if p == creator)
    posts = Counter(o for _, _, p, o in updates if p == like)

    def pick(counter: Counter, k: int) -> list[str]:
        ranked = [term for term, _ in counter.most_common()]
        return ranked[:k] if k <= len(ranked) else [rng.choice(ranked) for _ in range(k)]

    scale = n / 10_000
    k_tag, k_user, k_post = (max(1, round(SHARES[key] * scale)) for key in ("tag", "user", "post"))
    k_pair = max(0, n - k_tag - k_user - k_post)
    out: list[tuple[str, str]] = []
    for i, t in enumerate(pick(tags, k_tag)):
        out.append((f"tag{i}", f"SELECT ?post ?author WHERE {{ ?post sib:hashtag {t} . ?author sioc:creator_of ?post }}"))
    for i, u in enumerate(pick(users, k_user)):
        out.append((f"user{i}", f"SELECT ?post ?liker WHERE {{ {u} sioc:creator_of ?post . ?liker sib:like ?post }}"))
    for i, p in enumerate(pick(posts, k_post)):
        out.append((f"post{i}", f"SELECT ?liker WHERE {{ ?liker sib:like {p} }}"))
    ranked_users, ranked_tags = list(users), list(tags)
    pairs: set[tuple[str, str]] = set()
    while len(pairs) < k_pair:
        pairs.add((rng.choice(ranked_users), rng.choice(ranked_tags)))
    for i, (u, t) in enumerate(sorted(pairs)):
        out.append((f"pair{i}", f"SELECT ?post WHERE {{ {u} sioc:creator_of ?post . ?post sib:hashtag {t} }}"))
    return out[:n]


def replay(updates: Path, queries: list[Path], out: Path) -> dict:
    """One `cbgp replay` run in its own process: wall seconds, peak RSS (MB), deltas written."""
    args = [str(ROOT / ".venv" / "bin" / "cbgp"), "replay", "--patch", str(updates), "--out", str(out)]
    for path in queries:
        args += ["--query", f"{path.stem}={path}"]
    wrapper = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
               "rc = subprocess.run(sys.argv[1:]).returncode; w = time.perf_counter() - t; "
               "print(rc, w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", wrapper, *args], capture_output=True, text=True, check=True)
    rc, wall, rss_kb = done.stdout.split()
    if rc != "0":
        raise SystemExit(f"cbgp replay failed ({rc}) with {len(queries)} queries")
    with open(out, encoding="utf-8") as f:
        deltas = sum(1 for _ in f)
    return {"seconds": float(wall), "peak_mb": int(rss_kb) / 1024, "deltas": deltas}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--data", default=None, help="LSBench directory (default: ../shared/data/lsbench-1000)")
    args = parser.parse_args()

    start = time.perf_counter()
    dataset = lsbench.load_or_generate(Path(args.data) if args.data else lsbench.DEFAULT_DATA)
    updates = lsbench.build_updates(dataset).updates[: args.updates]
    queries = make_queries(updates, args.queries)
    print(f"{len(updates):,} updates ({dataset.source}), {len(queries):,} queries: "
          + ", ".join(f"{k} {v}" for k, v in Counter(name.rstrip('0123456789') for name, _ in queries).items())
          + f" ({time.perf_counter() - start:.1f} s to prepare)", flush=True)
    with tempfile.TemporaryDirectory(prefix="cbgp-many-") as tmp:
        work = Path(tmp)
        stream = work / "updates.rdfp"
        write_updates(updates, stream)
        paths = []
        for name, text in queries:
            path = work / f"{name}.rq"
            path.write_text(PREFIXES + text + "\n", encoding="utf-8")
            paths.append(path)
        runs: dict[str, list[dict]] = {"1": [], str(len(paths)): []}
        for round_no in range(args.repeat):
            for label, chosen in (("1", paths[:1]), (str(len(paths)), paths)):
                result = replay(stream, chosen, work / "deltas.out")
                runs[label].append(result)
                print(f"round {round_no + 1}: {label:>6} queries  {result['seconds']:7.2f} s  "
                      f"{result['peak_mb']:6.0f} MB  {result['deltas']:,} deltas", flush=True)
    one, many = runs["1"], runs[str(len(paths))]
    t1, tn = statistics.median(r["seconds"] for r in one), statistics.median(r["seconds"] for r in many)
    m1, mn = statistics.median(r["peak_mb"] for r in one), statistics.median(r["peak_mb"] for r in many)
    print(f"median: 1 query {t1:.2f} s {m1:.0f} MB; {len(paths):,} queries {tn:.2f} s {mn:.0f} MB: "
          f"time x{tn / t1:.2f} (goal 3), memory x{mn / m1:.2f} (goal 2)")
    print(json.dumps({"updates": len(updates), "queries": len(paths), "one": one, "many": many}))


if __name__ == "__main__":
    main()
