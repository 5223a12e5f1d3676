"""The Stream-WatDiv workload of ``bench/lsbench_fleet.py --stream watdiv``: its eight queries (WatDiv's basic
templates over the stream's vocabulary), through ``cbgp replay`` on the first updates of the stream with
deletions, equal pyoxigraph's answers after every update, so the bench's expected counts, which the fleet's
answers must match, are right.  Runs when the shared Stream-WatDiv file is present."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import watdiv  # noqa: E402

from tests.oracle import replay_matches_oracle  # noqa: E402

UPDATES = 10000


@pytest.mark.slow
@pytest.mark.skipif(not watdiv.DEFAULT_DATA.exists(), reason="shared Stream-WatDiv data not present")
def test_the_watdiv_bench_queries_through_replay_match_pyoxigraph_after_every_update(tmp_path: Path) -> None:
    updates = watdiv.updates(watdiv.load(limit=UPDATES))
    texts = {path.stem: path.read_text() for path in sorted((BENCH / "queries_watdiv").glob("*.rq"))}
    assert len(texts) == 8
    changed = replay_matches_oracle(tmp_path, updates, texts)
    assert all(changed[name] for name in texts), f"every query changes on the stream: {changed}"
