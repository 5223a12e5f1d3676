"""Saved state is sealed with the fleet's key: a blob another key wrote, or one altered, is never unpickled, and a
service that would checkpoint without a key refuses to start in one line."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from services.state.presence import load_snapshot, snapshot
from services.state.shards import dump_shard, load_shard
from services.wire.sealed import CheckpointKeyMissing, key, seal, unseal

REPO = Path(__file__).resolve().parents[3]


class Boom:
    """Unpickling this runs code: what a forged checkpoint would do."""

    def __reduce__(self):  # noqa: ANN204
        return (exec, ("raise SystemExit('unpickled a forged checkpoint')",))


def test_a_sealed_blob_opens_only_under_the_same_key(monkeypatch: pytest.MonkeyPatch) -> None:
    blob = seal(b"state")
    assert unseal(blob) == b"state"
    assert unseal(blob[:-1] + b"X") is None  # altered
    assert unseal(pickle.dumps(Boom())) is None  # not sealed at all: a raw pickle is refused
    monkeypatch.setenv("CBGP_CHECKPOINT_SECRET", "another-fleet-0123456789")
    assert unseal(blob) is None


def test_forged_shard_checkpoints_and_ingest_snapshots_are_not_unpickled(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_shard(dump_shard({"position": 3}))["position"] == 3
    assert load_shard(pickle.dumps(Boom())) is None
    forged = seal(pickle.dumps(Boom()))  # sealed, but under someone else's key
    monkeypatch.setenv("CBGP_CHECKPOINT_SECRET", "another-fleet-0123456789")
    assert load_shard(forged) is None and load_snapshot(forged) is None
    assert load_snapshot(snapshot({(1, 2, 3, 0): 1}, [(1, "<http://a>")], {"seq": 1}))[1] == {(1, 2, 3, 0): 1}


def test_a_service_that_would_checkpoint_without_a_key_refuses_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CBGP_CHECKPOINT_SECRET", "short")
    with pytest.raises(CheckpointKeyMissing, match="at least 16 characters"):
        key()
    env = {k: v for k, v in __import__("os").environ.items() if k != "CBGP_CHECKPOINT_SECRET"}
    done = subprocess.run([sys.executable, "-m", "services.commands.main", "ingest", "--bootstrap-servers",
                           "127.0.0.1:1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "CBGP_CHECKPOINT_SECRET" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
