"""What a FILTER costs a change, alone: one pattern ``?s <p> ?o`` with each FILTER below, distinct
language-tagged objects inserted one by one into one ``ContinuousEngine``.

    .venv/bin/python bench/filters_bench.py [--changes 3000] [--repeat 3]

Prints CPU µs per change, the best of ``--repeat`` runs, for each filter and for none (the operator tree's own
cost). To compare with another source tree, run it with ``PYTHONPATH=<that tree>``.
"""

from __future__ import annotations

import argparse
import time

FILTERS = {
    "none": "",
    'LANG(?o) = "en"': 'FILTER(LANG(?o) = "en")',
    'langMatches(LANG(?o), "en")': 'FILTER(langMatches(LANG(?o), "en"))',
    'STRSTARTS(STR(?o), "ab")': 'FILTER(STRSTARTS(STR(?o), "ab"))',
    "?s != ?o": "FILTER(?s != ?o)",
    'REGEX(STR(?o), "^ab")': 'FILTER(REGEX(STR(?o), "^ab"))',
}


def cost(text: str, changes: int, repeat: int) -> float:
    from cbgp.algebra.continuous import ContinuousEngine

    best = float("inf")
    for _ in range(repeat):
        engine = ContinuousEngine()
        engine.register("q", f"SELECT ?s ?o WHERE {{ ?s <http://x/p> ?o {text} }}")
        start = time.process_time()
        for i in range(changes):
            engine.apply_terms(1, f"<http://x/s{i}>", "<http://x/p>", f'"ab{i}"@en')
        best = min(best, (time.process_time() - start) / changes)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("| FILTER | µs per change |\n|---|---:|")
    for name, text in FILTERS.items():
        print(f"| `{name}` | {cost(text, args.changes, args.repeat):.1f} |", flush=True)


if __name__ == "__main__":
    main()
