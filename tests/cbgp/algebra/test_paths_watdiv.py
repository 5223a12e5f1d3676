"""Eight property-path queries, one of every form, on the Stream-WatDiv stream with deletions, through
`cbgp replay` (the command a user runs): after every update, the answers rebuilt from its deltas equal
pyoxigraph's re-evaluated from scratch, and each update's deltas are pyoxigraph's answers after it minus those
before it.  Runs when the shared Stream-WatDiv file is present (bench/watdiv.py reads it)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import watdiv  # noqa: E402

from tests.oracle import replay_matches_oracle  # noqa: E402

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
    changed = replay_matches_oracle(tmp_path, updates, texts)
    assert all(changed[name] for name in texts), f"every query changes on the stream: {changed}"
