"""The one runner loop (``services.runtime.runner``) and the processors it drives.

- every data-path service is a processor of the runner: its service name is a topology's key (what
  ``cbgp describe`` prints), and it has every step the runner calls;
- on a real broker: a processor's outputs and its input offsets commit together, ``committed`` is called only
  once they are visible, a stop closes it clean, and a failure in ``process`` closes it unclean with neither
  its outputs nor its offsets committed.
"""

from __future__ import annotations

import inspect
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from services.answers.service import AnswersService
from services.ingest.service import IngestService
from services.kafka import client
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_consumer, make_producer
from services.wire.records import Output
from services.runtime.runner import Processor, Step, run_processor
from services.runtime.life import Stopper
from services.kafka.fetch import GroupInput
from services.wire.topology import TOPOLOGIES
from services.worker.service import WorkerService

SERVICES = (IngestService, WorkerService, AnswersService)
STEPS = [name for name, _ in inspect.getmembers(Processor, inspect.isfunction) if not name.startswith("_")]


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.__name__)
def test_every_data_path_service_is_a_processor_of_the_runner(service: type) -> None:
    assert service.service in TOPOLOGIES, "its topology is what `cbgp describe` prints"
    assert TOPOLOGIES[service.service].loop == f"services.runtime.runner.run_processor({service.__module__}.{service.__name__})"
    assert set(STEPS) == {"open", "poll", "process", "committed", "idle", "close"}
    for step in STEPS:
        ours, theirs = inspect.signature(getattr(service, step)), inspect.signature(getattr(Processor, step))
        assert len(ours.parameters) == len(theirs.parameters), f"{service.__name__}.{step}{ours} is not {theirs}"


class Copier:
    """A processor copying each record of ``source`` to ``sink``, with a log of the runner's calls."""

    service = "copier"

    def __init__(self, settings: KafkaSettings, source: str, sink: str, stopper: Stopper, stop_after: int,
                 fail_at: int | None = None) -> None:
        self.settings, self.source, self.sink = settings, source, sink
        self.stopper, self.stop_after, self.fail_at = stopper, stop_after, fail_at
        self.group = settings.topic("copier")
        self.producer = make_producer(settings, transactional_id=self.group + ".0")
        self.input: GroupInput | None = None
        self.calls: list[str] = []
        self.copied = 0

    def open(self) -> None:
        self.calls.append("open")
        self.input = GroupInput(self.settings, self.group, [self.source], 100)

    def poll(self) -> list:
        assert self.input is not None
        return [m for m in self.input.poll() if m.error() is None]

    def process(self, msgs: list) -> Step | None:
        if not msgs:
            return None
        if self.fail_at is not None and self.copied + len(msgs) > self.fail_at:
            raise RuntimeError("a bug in process")
        self.calls.append("process")
        outputs = [Output(self.sink, m.value(), partition=0) for m in msgs]
        last = {m.partition(): m.offset() + 1 for m in msgs}
        assert self.input is not None
        tps = [TopicPartition(self.source, p, o) for p, o in last.items()]
        return Step(outputs, [(tps, self.input.member.consumer_group_metadata())], len(msgs), len(msgs))

    def committed(self, step: Step) -> None:
        # Only now are the outputs durable: a read_committed reader sees them.
        visible = end_offsets(self.settings, self.sink)[0][1]
        self.calls.append(f"committed visible={visible >= self.copied + step.detail}")
        self.copied += step.detail
        if self.copied >= self.stop_after:
            self.stopper.stopping = True

    def idle(self) -> None:
        return None

    def close(self, clean: bool) -> None:
        self.calls.append(f"close clean={clean}")
        if self.input is not None:
            self.input.close()
        self.producer.flush(5)


def _publish(settings: KafkaSettings, topic: str, count: int) -> None:
    producer = make_producer(settings, idempotent=True)
    for i in range(count):
        producer.produce(topic, b"r%d" % i, partition=0)
    producer.flush(10)


def _committed(settings: KafkaSettings, group: str, topic: str) -> int:
    member: Consumer = make_consumer(settings, group)
    try:
        return member.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        member.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_outputs_and_offsets_commit_together_and_committed_follows(kafka_settings: KafkaSettings) -> None:
    source, sink = kafka_settings.topic("updates.raw"), kafka_settings.topic("deadletter")
    _publish(kafka_settings, source, 30)
    client.OUTAGES[0] += 1  # an outage some earlier client of this process saw (another test's broker) ...
    stopper, ready = Stopper(), [False]
    copier = Copier(kafka_settings, source, sink, stopper, stop_after=30)
    run_processor(copier, stopper, ready)  # ... is not one of this life's clients: its transactions commit
    assert copier.calls[0] == "open" and copier.calls[-1] == "close clean=True"
    commits = [c for c in copier.calls if c.startswith("committed")]
    assert commits and all(c == "committed visible=True" for c in commits)
    assert ready == [False]
    assert _committed(kafka_settings, copier.group, source) == 30
    assert end_offsets(kafka_settings, sink)[0][1] >= 30

    # A bug in process: the life ends unclean, nothing of that batch is committed (no output, no offset).
    _publish(kafka_settings, source, 10)
    stopper = Stopper()
    failing = Copier(kafka_settings, source, sink, stopper, stop_after=10, fail_at=0)
    before = end_offsets(kafka_settings, sink)[0][1]
    with pytest.raises(RuntimeError, match="a bug in process"):
        run_processor(failing, stopper, ready)
    assert failing.calls[-1] == "close clean=False" and "process" not in failing.calls
    assert _committed(kafka_settings, failing.group, source) == 30
    assert end_offsets(kafka_settings, sink)[0][1] == before


class _Producer:
    """The producer calls of a transaction, recorded (the loop's cadence is under test, not Kafka)."""

    def __init__(self) -> None:
        self.commits: list[float] = []

    def poll(self, _timeout: float) -> int:
        return 0

    def begin_transaction(self) -> None:
        pass

    def produce(self, *_args: object, **_kwargs: object) -> None:
        pass

    def send_offsets_to_transaction(self, *_args: object) -> None:
        pass

    def flush(self, _timeout: float) -> int:
        return 0

    def commit_transaction(self, _timeout: float) -> None:
        self.commits.append(time.monotonic())


class _Ticker:
    """A processor with one input record at every poll, committed with its offset."""

    service = "copier"

    def __init__(self, stopper: Stopper, batches: int) -> None:
        self.producer = _Producer()
        self.stopper, self.batches, self.polls = stopper, batches, 0

    def open(self) -> None:
        pass

    def poll(self) -> list[int]:
        self.polls += 1
        return [self.polls]

    def process(self, batch: list[int]) -> Step:
        return Step([], [([TopicPartition("t", 0, batch[0])], None)], 1)

    def committed(self, step: Step) -> None:
        if len(self.producer.commits) >= self.batches:
            self.stopper.stopping = True

    def idle(self) -> None:
        return None

    def close(self, clean: bool) -> None:
        pass


@pytest.mark.parametrize("gap_ms", [0, 80])
def test_a_minimum_transaction_gap_spaces_the_commits(monkeypatch: pytest.MonkeyPatch, gap_ms: int) -> None:
    """CBGP_MIN_TRANSACTION_MS: the loop polls again only that long after a commit (input gathers meanwhile),
    and without it as soon as the commit is done."""
    monkeypatch.setenv("CBGP_MIN_TRANSACTION_MS", str(gap_ms))
    stopper = Stopper()
    ticker = _Ticker(stopper, batches=6)
    run_processor(ticker, stopper, [False])
    gaps = [b - a for a, b in zip(ticker.producer.commits, ticker.producer.commits[1:])]
    assert len(gaps) == 5
    if gap_ms:
        assert min(gaps) >= gap_ms / 1000
    else:
        assert sum(gaps) < 5 * 0.08 / 2  # (well under the 80 ms gap each, on a busy machine too)
