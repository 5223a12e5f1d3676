"""Ingest commits what it processed once a batch has run for ``CBGP_MAX_BATCH_MS`` and leaves the rest of the
batch to the next transaction (``services.runtime.runner.batch_deadline``): a backlog flows downstream in slices.

On the embedded broker, with the limit at 0 (one raw record a transaction): five raw records become five
transactions, each record processed once and in order, every change numbered once; a re-assignment meanwhile
(the fetcher's positions replaced) drops the records given back, which are read again from the new positions.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pytest

from services import codec
from services.ingest.service import IngestService, register
from services.kafka.client import broker_outages, make_producer, read_all
from services.kafka.topics import ensure_topics
from services.runtime import runner
from services.runtime.life import commit_transaction, set_life
from tests.fixtures.broker import fresh_settings

RECORDS = 5


def _ingest_args(state_dir: Path) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["ingest", "--instance-id", "i1", "--state-dir", str(state_dir),
                              "--checkpoint-interval", "-1"])


def _turns(service: IngestService, quiet: float = 3.0, most: int | None = None) -> list[dict[int, int]]:
    """Poll, process and commit as the runner does until nothing came for ``quiet`` seconds after the last
    record (the first waits up to a minute), or ``most`` transactions; each transaction's raw positions, in
    order."""
    positions: list[dict[int, int]] = []
    last = time.monotonic() + 60 - quiet
    while time.monotonic() - last < quiet and len(positions) != most:
        step = service.process(service.poll())
        if step is None or not step.offsets:
            continue
        commit_transaction(service.producer, step.outputs, step.offsets)
        service.committed(step)
        positions.append(dict(step.detail))
        last = time.monotonic()
    return positions


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_batch_over_its_time_commits_what_it_processed_and_the_rest_goes_in_the_next_transactions(
        embedded_broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    settings = fresh_settings(embedded_broker)
    ensure_topics(settings)
    raw_topic = settings.topic("updates.raw")
    producer = make_producer(settings, idempotent=True)
    for r in range(RECORDS):
        lines = [f"A <http://e/s{r}> <http://e/p> <http://e/o{i}> ." for i in range(3)]
        producer.produce(raw_topic, ("\n".join(lines) + "\n").encode(), partition=0)
    assert producer.flush(10) == 0

    monkeypatch.setattr(runner, "MAX_BATCH_SECONDS", 0.0)
    service = IngestService(settings, _ingest_args(tmp_path / "state"))
    set_life(broker_outages())
    service.open()
    try:
        first = _turns(service, most=1)  # one transaction: the first record; the rest were given back
        assert first == [{0: 1}]
        assert service.consumer is not None
        fetcher = service.consumer.fetcher
        assert [m.offset() for m in fetcher.carried] == list(range(1, RECORDS))
        fetcher.set_positions({(raw_topic, 0): 1})  # as a re-assignment does, at the committed offset
        assert fetcher.carried == []
        rest = _turns(service)
    finally:
        service.close(clean=True)

    assert first + rest == [{0: r + 1} for r in range(RECORDS)], "one raw record a transaction, each once, in order"
    seqs = [change.seq for m in read_all(settings, settings.topic("updates.encoded"))
            for change in codec.encoded_changes(m.value())]
    assert seqs == list(range(1, 3 * RECORDS + 1)), "every change numbered once, none lost"
