"""Parse throughput of `cbgp.inputs.formats` on generated inputs (updates per second).

Usage: .venv/bin/python bench/inputs_bench.py [--lines 200000] [--repeat 1]

Generates one input per format with the same `--lines` statements (a mix of
IRI, literal, language-tagged, typed and blank-node objects, 5% deletes for
patch), parses each, and prints updates/s.  Errors found are printed too: a
non-zero count means the generator or the parser is broken.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cbgp.inputs.formats import InputError, parse_json_lines, parse_ntriples, parse_patch  # noqa: E402


def _objects(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.5:
        return f"<http://example.org/resource/{rng.randrange(50_000)}>"
    if kind < 0.7:
        return f'"value {rng.randrange(1_000_000)}"'
    if kind < 0.8:
        return f'"label {rng.randrange(1000)}"@en'
    if kind < 0.9:
        return f'"{rng.randrange(10_000)}"^^<http://www.w3.org/2001/XMLSchema#integer>'
    return f"_:b{rng.randrange(10_000)}"


def generate(lines: int, seed: int = 7) -> list[tuple[str, str, str, str]]:
    """(op, s, p, o) rows, terms in N-Triples syntax."""
    rng = random.Random(seed)
    rows = []
    for _ in range(lines):
        s = f"<http://example.org/resource/{rng.randrange(50_000)}>"
        p = f"<http://example.org/vocab#p{rng.randrange(40)}>"
        rows.append(("D" if rng.random() < 0.05 else "A", s, p, _objects(rng)))
    return rows


def as_patch(rows: list[tuple[str, str, str, str]]) -> str:
    return "".join(f"{op} {s} {p} {o} .\n" for op, s, p, o in rows)


def as_ntriples(rows: list[tuple[str, str, str, str]]) -> str:
    return "".join(f"{s} {p} {o} .\n" for _, s, p, o in rows)


def as_jsonl(rows: list[tuple[str, str, str, str]]) -> str:
    return "".join(
        json.dumps({"op": "+" if op == "A" else "-", "s": s, "p": p, "o": o}) + "\n" for op, s, p, o in rows
    )


def measure(name: str, parse: Callable[[str], Iterator[object]], text: str, repeat: int) -> None:
    best = float("inf")
    updates = errors = 0
    for _ in range(repeat):
        start = time.perf_counter()
        updates = errors = 0
        for item in parse(text):
            if isinstance(item, InputError):
                errors += 1
            else:
                updates += 1
        best = min(best, time.perf_counter() - start)
    print(f"{name:10s} {updates:8d} updates  {best:6.2f} s  {updates / best:10,.0f} updates/s  errors={errors}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    rows = generate(args.lines)
    print(f"input: {args.lines} lines per format (python {sys.version.split()[0]})", flush=True)
    measure("patch", parse_patch, as_patch(rows), args.repeat)
    measure("ntriples", parse_ntriples, as_ntriples(rows), args.repeat)
    measure("jsonl", parse_json_lines, as_jsonl(rows), args.repeat)


if __name__ == "__main__":
    main()
