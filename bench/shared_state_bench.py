"""Many queries of one shape over one LSBench stream: what each extra query costs.

Every case registers N queries ``SELECT * WHERE { ?post sib:hashtag "TAG" . ?fan sib:like ?post }``, one
per hashtag (the N most frequent hashtags of the stream; past the number of distinct hashtags the list is
repeated, so such queries share everything), and replays the first ``--updates`` updates of the LSBench
stream (``bench/lsbench.py``: the files in ``--data`` when present, else its generator) with
``cbgp replay`` in a child process.  It reports the wall time and the child's peak RSS, and a digest of
the sorted delta lines (two source trees that agree on every answer print the same digest).

``--repo PATH`` runs the ``cbgp`` of another source tree (for a before/after comparison:
``git archive <commit> | tar -x -C /tmp/before`` then ``--repo /tmp/before``).

    .venv/bin/python bench/shared_state_bench.py --counts 1,10,100,500

One line per case, then one JSON object as the last line:
``{"updates": U, "cases": {"N": {"seconds": S, "peak_rss_mb": M, "deltas": D, "digest": H}, ...}}``.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import lsbench  # noqa: E402

QUERY = 'SELECT * WHERE {{ ?post <{sib}hashtag> {tag} . ?fan <{sib}like> ?post }}'


def updates_file(work: Path, data: Path, n: int) -> tuple[Path, list[str]]:
    """The first n updates as RDF Patch (cached in work), and the hashtags, most frequent first."""
    path = work / f"lsbench-{n}.rdfp"
    tags_path = work / f"lsbench-{n}.tags.json"
    if path.exists() and tags_path.exists():
        return path, json.loads(tags_path.read_text())
    stream = lsbench.build_updates(lsbench.load_or_generate(data))
    rows = stream.updates[:n]
    counts = collections.Counter(o for _sign, _s, p, o in rows if p == f"<{lsbench.SIB}hashtag>")
    tags = [tag for tag, _count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    with open(path, "w", encoding="utf-8") as out:
        for sign, s, p, o in rows:
            out.write(f"{'A' if sign > 0 else 'D'} {s} {p} {o} .\n")
    tags_path.write_text(json.dumps(tags))
    return path, tags


def run_case(repo: Path, patch: Path, tags: list[str], n: int, work: Path) -> dict:
    qdir = work / f"queries-{n}"
    qdir.mkdir(exist_ok=True)
    args = []
    for i in range(n):
        q = qdir / f"q{i}.rq"
        q.write_text(QUERY.format(sib=lsbench.SIB, tag=tags[i % len(tags)]))
        args += ["--query", f"q{i}={q}"]
    out = work / f"deltas-{n}.jsonl"
    env = dict(os.environ, PYTHONPATH=str(repo))
    command = [sys.executable, "-m", "services.commands.main", "replay", "--patch", str(patch), "--out", str(out), *args]
    start = time.perf_counter()
    child = subprocess.Popen(command, env=env, cwd=str(repo), stderr=subprocess.PIPE)
    _pid, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    err = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"cbgp replay failed for {n} queries:\n{err}")
    lines = out.read_text().splitlines()
    digest = hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()[:16]
    out.unlink()
    return {"seconds": round(seconds, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "deltas": len(lines),
            "digest": digest}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", default="1,10,100,500", help="numbers of queries, comma-separated")
    parser.add_argument("--updates", type=int, default=200_000)
    parser.add_argument("--data", default=str(lsbench.DEFAULT_DATA))
    parser.add_argument("--repo", default=str(HERE.parent), help="source tree whose cbgp runs")
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "cbgp-shared-state-bench"))
    parser.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.prepare:
        updates_file(work, Path(args.data), args.updates)
        return 0
    # Prepared in a child: a parent holding the loaded dataset would count in every child's peak RSS
    # (Linux keeps ru_maxrss across fork and exec).
    subprocess.run([sys.executable, __file__, "--prepare", "--updates", str(args.updates), "--data", args.data,
                    "--work", str(work)], check=True)
    patch, tags = updates_file(work, Path(args.data), args.updates)
    cases = {}
    for n in (int(c) for c in args.counts.split(",")):
        r = cases[str(n)] = run_case(Path(args.repo), patch, tags, n, work)
        print(f"{n:>6} queries: {r['seconds']:7.2f} s  peak RSS {r['peak_rss_mb']:8.1f} MB  "
              f"{r['deltas']:,} deltas  digest {r['digest']}", flush=True)
    print(json.dumps({"updates": args.updates, "repo": args.repo, "cases": cases}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
