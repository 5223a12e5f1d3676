"""Requests to the registry: an ``AdminCommand`` on ``admin`` answered by a ``QueryStatus`` on
``queries.status``, and the registered ``QueryPlan`` of a query read from ``queries.plans``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import TopicPartition

from services.codec import CodecError, decode, encode
from services.kafka.config import KafkaSettings
from services.kafka.client import end_offsets, make_consumer, make_producer, read_all
from services.client.errors import UserError

ACK_WAIT_S = 10.0  # at least this long for the broker's acknowledgement of a command


def admin_request(settings: KafkaSettings, command: dict[str, Any], wait: float = 30.0) -> dict[str, Any]:
    """Send one ``AdminCommand`` and return the registry's ``QueryStatus`` reply (matched by request_id).

    Raises :class:`UserError` if no reply arrives within ``wait`` seconds.
    """
    request_id = command.get("request_id") or uuid.uuid4().hex
    command = {"query_id": None, "sparql": None, "options": {}, **command, "request_id": request_id}
    status_topic = settings.topic("queries.status")
    # Take the reply topic's end *before* sending: the reply is necessarily after it.
    start = end_offsets(settings, status_topic).get(0, (0, 0))[1]
    consumer = make_consumer(settings, f"cbgp-cli-{request_id}", fetch_wait_max_ms=50)
    try:
        consumer.assign([TopicPartition(status_topic, 0, start)])
        # Not idempotent: librdkafka's idempotent producer delivers its first record only once its producer id
        # came, on a 500 ms timer (0.5-1.0 s of a 1.5 s command).  A command sent twice by a retry is harmless:
        # REGISTER of the same text is idempotent, and this reply is the first one with its request_id.
        producer = make_producer(settings, idempotent=False)
        producer.produce(settings.topic("admin"), value=encode("AdminCommand", command))
        # The broker answered end_offsets above: give its acknowledgement time of its own (a first write to
        # the admin topic may create it), so that a short --wait bounds the wait for the registry's reply only.
        acknowledge = max(wait, ACK_WAIT_S)
        if producer.flush(acknowledge):
            raise UserError(f"the broker at {settings.bootstrap_servers} did not acknowledge the command within "
                            f"{acknowledge:g} s")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None or msg.value() is None:
                continue
            try:
                status = decode("QueryStatus", msg.value())
            except CodecError:
                continue  # someone else's garbage on the status topic is not our reply
            if status.get("request_id") == request_id:
                return status
        raise UserError(f"no reply from the registry within {wait:g} s (is `cbgp registry` running on "
                        f"{settings.bootstrap_servers} with topic prefix {settings.topic_prefix!r}?)")
    finally:
        consumer.close()


def format_status(status: dict[str, Any]) -> str:
    """One line for a reply: ``accepted: <class ...>`` or ``rejected: <message> (line L, column C)``."""
    kind = status["status"].lower()
    where = f" (line {status['line']}, column {status['column']})" if status.get("line") is not None else ""
    return f"{kind}: {status['message']}{where}"


def registered_plan(settings: KafkaSettings, query_id: str) -> dict[str, Any] | None:
    """The query's current ``QueryPlan`` from ``queries.plans``, or None if it is not registered."""
    plan = None
    for msg in read_all(settings, settings.topic("queries.plans"), timeout=60):
        if msg.key() == query_id.encode():
            try:
                plan = None if msg.value() is None else decode("QueryPlan", msg.value())
            except CodecError:
                continue
    return plan


def require_plan(settings: KafkaSettings, query_id: str) -> dict[str, Any]:
    plan = registered_plan(settings, query_id)
    if plan is None:
        raise UserError(f"no query with id {query_id!r} is registered (`cbgp list` shows the registered ids)")
    return plan
