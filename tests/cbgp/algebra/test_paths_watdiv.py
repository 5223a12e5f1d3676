"""Eight property-path queries, one of every form, on the Stream-WatDiv stream with deletions, through
`cbgp replay` (the command a user runs): after every update, the answers rebuilt from its deltas equal
pyoxigraph's re-evaluated from scratch, and each update's deltas are pyoxigraph's answers after it minus those
before it.  Runs when the shared Stream-WatDiv file is present (bench/watdiv.py reads it)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import watdiv  # noqa: E402

from cbgp.terms import from_sparql_json  # noqa: E402
from tests.oracle import OracleGraph  # noqa: E402

W = watdiv.WSDBM
REV = "http://purl.org/stuff/rev#"
UPDATES = 6000


def queries(updates: list) -> dict[str, str]:
    follows = Counter(s for _d, s, p, _o in updates if p == f"<{W}follows>")
    busy = [user for user, _ in follows.most_common(3)]
    followed = Counter(o for _d, _s, p, o in updates if p == f"<{W}follows>").most_common(1)[0][0]
    buyer = Counter(s for _d, s, p, _o in updates if p in (f"<{W}makesPurchase>", f"<{W}subscribes>"))
    buyer = buyer.most_common(1)[0][0]
    return {
        "plus": f"SELECT ?u WHERE {{ {busy[0]} <{W}follows>+ ?u }}",
        "star_to": f"SELECT ?u WHERE {{ ?u <{W}follows>* {followed} }}",
        "optional_step": f"SELECT ?u WHERE {{ {busy[1]} <{W}follows>? ?u }}",
        "sequence": f"SELECT ?u ?p WHERE {{ ?u <{W}follows>/<{W}likes> ?p }}",
        "alternative": f"SELECT ?u ?x WHERE {{ ?u <{W}likes>|<{W}subscribes> ?x }}",
        "inverse": f"SELECT ?u ?p WHERE {{ ?u ^<{REV}reviewer>/^<{REV}hasReview> ?p }}",
        "negated": f"SELECT ?o WHERE {{ {buyer} !(<{W}follows>|<{W}likes>) ?o }}",
        "closure_of_sequence": f"SELECT ?u WHERE {{ {busy[2]} (<{W}follows>/<{W}follows>)+ ?u }}",
    }


@pytest.mark.slow
@pytest.mark.skipif(not watdiv.DEFAULT_DATA.exists(), reason="shared Stream-WatDiv data not present")
def test_every_path_form_on_stream_watdiv_with_deletions_through_replay_matches_pyoxigraph(tmp_path: Path):
    updates = watdiv.updates(watdiv.load(limit=UPDATES))
    assert sum(1 for d, *_ in updates if d < 0) > 400
    texts = queries(updates)
    patch = tmp_path / "stream.rdfp"
    patch.write_text("".join(f"{'A' if d > 0 else 'D'} {s} {p} {o} .\n" for d, s, p, o in updates))
    args = [sys.executable, "-m", "services.commands.main", "replay", "--patch", str(patch)]
    for name, text in texts.items():
        (tmp_path / f"{name}.rq").write_text(text)
        args += ["--query", f"{name}={tmp_path / name}.rq"]
    result = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    by_seq: dict[int, dict[str, Counter]] = {}
    for line in result.stdout.splitlines():
        delta = json.loads(line)
        row = tuple(sorted((v, from_sparql_json(t)) for v, t in delta["binding"].items()))
        by_seq.setdefault(delta["seq"], {}).setdefault(delta["query"], Counter())[row] += \
            1 if delta["sign"] == "+" else -1
    oracle = OracleGraph()
    before = {name: Counter() for name in texts}
    changed = Counter()
    for seq, (d, s, p, o) in enumerate(updates, 1):
        oracle.apply(d, s, p, o)
        for name, text in texts.items():
            after = oracle.answers(text)
            want = Counter(after)
            want.subtract(before[name])
            want = Counter({row: n for row, n in want.items() if n})
            got = Counter({row: n for row, n in by_seq.get(seq, {}).get(name, Counter()).items() if n})
            assert got == want, f"{name} at update {seq} {(d, s, p, o)}"
            changed[name] += bool(want)
            before[name] = after
    assert all(changed[name] for name in texts), f"every query changes on the stream: {changed}"
