"""The gateway's state and message formats, without Kafka or HTTP (unit-tested on their own).

- :class:`Stream`: one registration's numbered answers (``(query, version)``), as the gateway read them from
  ``answers``: a list from ``n = base`` (older ones trimmed past ``history``), and their fold (the current answers,
  bag semantics), so ``GET /queries/ID/current`` and a SEPA subscription's first notification need no topic read.
- :class:`Hub`: the registered queries (from ``queries.plans``) and their streams; subscribers (SSE or SEPA
  WebSocket) attach to a query id and are woken when its stream grows.  Fan-out costs one event per subscriber:
  each keeps its own cursor (an answer number) into the stream, so a slow subscriber never holds up the others.
- SEPA notifications (:func:`sepa_notification`): ``{"notification": {"spuid", "alias", "sequence",
  "addedResults", "removedResults"}}`` with SPARQL 1.1 Query Results JSON inside, as the SEPA broker (and its
  clients, e.g. ``sepy``) speak it; a notification carries the net change of the answers it covers.
- Shares (:class:`Share`): with several replicas, each holds the answers of the queries on its share of the
  ``answers`` partitions; another replica follows a query it does not hold from the one that does.
- Auth (:class:`Tokens`): bearer tokens with a ``read``, ``read-write`` or ``admin`` scope, each with an owner name
  (a token may replace or remove only its own owner's queries, unless it is ``admin``).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter
from http import HTTPStatus
from dataclasses import dataclass
from typing import Any, Callable, Iterable

__all__ = ["Answer", "Grant", "Hub", "Limits", "QueryInfo", "Share", "Stream", "Subscriber", "Tokens", "TokenError",
           "READ", "READ_WRITE", "ADMIN", "problem", "sepa_notification", "sse_event", "subscription_id",
           "binding_key"]

READ, READ_WRITE, ADMIN = "read", "read-write", "admin"
SCOPES = (READ, READ_WRITE, ADMIN)  # each allows what the ones before it allow


BindingKey = tuple[tuple[str, ...], ...]


def binding_key(binding: dict[str, Any]) -> BindingKey:
    """A canonical, hashable, orderable key for a SPARQL JSON binding (fold key): per variable, in order, its
    term's type, value, datatype and language.  A third of the gateway's time went to canonical JSON text
    instead.  A binding of another shape (a peer's relay is input like any other) is keyed by its JSON text, in
    the same tuple shape, so keys always compare.  ``codec.decode_answer_json`` makes the same key for the answers
    it reads (``Answer.key``)."""
    try:
        key = tuple(sorted((var, term["type"], term["value"], term.get("datatype", ""), term.get("xml:lang", ""))
                           for var, term in binding.items()))
        if all(isinstance(field, str) for item in key for field in item):
            return key
    except (TypeError, KeyError, AttributeError):
        pass
    return (("", json.dumps(binding, sort_keys=True, separators=(",", ":"), default=repr)),)


def subscription_id(sparql: str) -> str:
    """The query id a SEPA subscription registers its text under (same text, same id)."""
    return "sepa-" + hashlib.sha256(sparql.encode("utf-8")).hexdigest()[:16]


@dataclass(slots=True)
class Answer:
    """One answer as the gateway holds it: the fields clients see, and its JSON text (encoded once)."""

    n: int
    sign: str
    binding: dict[str, Any]
    seq: int
    snapshot: bool
    produced_at_ms: int
    version: int
    query_id: str
    text: str = ""
    folded: bool = True  # False: already in the stream's seed (answers.current), history only
    key: Any = None  # binding_key(binding) when the decoder made it (codec.decode_answer_json), else None

    def fold_key(self) -> "BindingKey":
        return binding_key(self.binding) if self.key is None else self.key

    @classmethod
    def from_json(cls, data: Any) -> "Answer":
        """An answer as another replica's SSE stream sent it (:meth:`to_json`); ValueError if it is not one."""
        try:
            answer = cls(data["n"], data["sign"], data["binding"], data["seq"], data["snapshot"],
                         data["produced_at_ms"], data["version"], data["query"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not an answer: {exc}") from None
        if not (isinstance(answer.n, int) and answer.n >= 1 and answer.sign in ("+", "-")
                and isinstance(answer.binding, dict) and isinstance(answer.version, int)
                and isinstance(answer.query_id, str) and isinstance(answer.produced_at_ms, int)):
            raise ValueError("not an answer: a field has the wrong type")
        return answer

    def to_json(self) -> dict[str, Any]:
        return {"query": self.query_id, "version": self.version, "n": self.n, "seq": self.seq, "sign": self.sign,
                "binding": self.binding, "snapshot": self.snapshot, "produced_at_ms": self.produced_at_ms}

    def encoded(self) -> str:
        if not self.text:
            self.text = json.dumps(self.to_json(), separators=(",", ":"))
        return self.text


class Stream:
    """One registration's answers: ``answers[i]`` has ``n = base + i``; ``current`` is their fold."""

    def __init__(self, query_id: str, version: int, history: int) -> None:
        self.query_id, self.version, self.history = query_id, version, history
        self.answers: list[Answer] = []
        self.base = 1
        self.current: dict[BindingKey, list] = {}  # binding key -> [binding, multiplicity]
        self.duplicates = 0
        self.gaps = 0
        self.touched = time.monotonic()  # when it was made or last given an answer

    @property
    def next_n(self) -> int:
        return self.base + len(self.answers)

    def add(self, answer: Answer) -> bool:
        """Append ``answer`` if it is the next number (a duplicate is dropped, a gap counted); True if kept."""
        if answer.n < self.next_n:
            self.duplicates += 1
            return False
        self.touched = time.monotonic()
        if answer.n > self.next_n:
            self.gaps += 1
            if not self.answers:
                self.base = answer.n  # started after a trimmed past: retention deleted the older answers
        self.answers.append(answer)
        if not answer.folded:
            return True
        key = answer.fold_key()
        entry = self.current.get(key)
        if answer.sign == "+":
            if entry is None:
                self.current[key] = [answer.binding, 1]
            else:
                entry[1] += 1
        elif entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                del self.current[key]
        if self.history and len(self.answers) > 2 * self.history:
            cut = len(self.answers) - self.history
            del self.answers[:cut]
            self.base += cut
        return True

    def since(self, n: int, limit: int | None = None) -> list[Answer]:
        """The answers numbered ``n`` and up (from the oldest kept if ``n`` was trimmed), at most ``limit``."""
        start = max(0, n - self.base)
        return self.answers[start:] if limit is None else self.answers[start:start + limit]

    def rows(self) -> list[dict[str, Any]]:
        """The current answers as SPARQL JSON bindings, one per unit of multiplicity, in a stable order."""
        return [binding for key in sorted(self.current) for binding in
                [self.current[key][0]] * self.current[key][1]]


@dataclass(frozen=True)
class Limits:
    """What one client or request may take of a gateway (each a flag of ``cbgp gateway``; the defaults suit a small
    machine).  A request over a limit gets one line that names the flag."""

    query_timeout_s: float = 10.0  # --query-timeout: one /query's evaluation
    query_max_rows: int = 10_000  # --query-max-rows: rows (or triples) of one /query result
    query_workers: int = 2  # --query-workers: /query evaluations at once, on their own threads
    query_queue: int = 8  # --query-queue: /query requests waiting for a worker before 503
    query_max_memory_mb: int = 512  # --query-max-memory: MB one /query's evaluation may allocate (0: unbounded)
    max_connections: int = 10_000  # --max-connections: open SSE and WebSocket connections
    max_connections_per_client: int = 1_000  # --max-connections-per-client: from one address
    max_subscriptions_per_socket: int = 100  # --max-subscriptions-per-socket: SEPA subscriptions on one WebSocket
    slow_client_s: float = 30.0  # --slow-client-timeout: a write that waits this long evicts its client
    chunk: int = 500  # answers per SSE write or SEPA notification (a client's buffer is one chunk)
    sepa_idle_s: float = 60.0  # a query registered for SEPA subscriptions is unregistered after this long unused
    ended_keep_s: float = 60.0  # --unregistered-keep: an unregistered query's answers, after its last one, unread


@dataclass(frozen=True)
class Share:
    """Which queries this replica holds: those whose ``answers`` partition ``p`` has ``p % count == index`` (the
    answers topic is keyed by query, so a replica reads and keeps only its share of it)."""

    index: int = 0
    count: int = 1

    @classmethod
    def parse(cls, text: str, hostname: str = "") -> "Share":
        """``I/N``, or ``host/N``: ``I`` is the number the host name ends with (a StatefulSet's pod ordinal)."""
        index_text, sep, count_text = text.partition("/")
        if index_text == "host":
            found = re.search(r"(\d+)$", hostname)
            if found is None:
                raise ValueError(f"--share {text}: the host name {hostname!r} does not end with a number")
            index_text = found.group(1)
        if not sep or not index_text.isdigit() or not count_text.isdigit():
            raise ValueError(f"--share {text!r}: expected INDEX/COUNT (e.g. 0/3) or host/COUNT")
        share = cls(int(index_text), int(count_text))
        if not 0 <= share.index < share.count:
            raise ValueError(f"--share {text}: the index must be from 0 to {share.count - 1}")
        return share

    @property
    def whole(self) -> bool:
        return self.count == 1

    def owner(self, partition: int) -> int:
        """The replica holding the queries of ``answers`` partition ``partition``."""
        return partition % self.count

    def holds(self, partition: int) -> bool:
        return self.owner(partition) == self.index

    def peers(self, text: str) -> list[str]:
        """Every replica's base URL, by index: from a comma-separated list of ``count`` URLs, or one URL with
        ``{i}`` where the index goes (``http://cbgp-gateway-{i}.cbgp-gateway-peers:8080``)."""
        urls = [u.strip().rstrip("/") for u in text.split(",") if u.strip()]
        if len(urls) == 1 and "{i}" in urls[0]:
            urls = [urls[0].replace("{i}", str(i)) for i in range(self.count)]
        if len(urls) != self.count or not all(u.startswith(("http://", "https://")) for u in urls):
            raise ValueError(f"--peers: expected {self.count} http(s) URLs (or one with {{i}}), got {text!r}")
        return urls


@dataclass
class QueryInfo:
    """A registered query, from its ``QueryPlan`` record."""

    query_id: str
    sparql: str
    version: int
    options: dict[str, str]
    projected: list[str]
    query_class: str
    placement: str
    registered_at_seq: int

    @classmethod
    def from_plan(cls, plan: dict[str, Any]) -> "QueryInfo":
        try:
            decoded = json.loads(plan["plan_json"])
        except (ValueError, TypeError):
            decoded = {}
        return cls(plan["query_id"], plan["sparql"], plan["version"], dict(plan.get("options") or {}),
                   list(plan.get("projected") or []), decoded.get("class", "?"), decoded.get("placement", "?"),
                   plan.get("registered_at_seq", 0))

    def window(self) -> str | None:
        """The window in words (``sliding range PT10S step PT1S``), or None."""
        from services.wire.registrations import read_registration

        try:
            _text, spec = read_registration(self.sparql, self.options)
        except Exception:  # noqa: BLE001 - a plan the registry accepted; shown as unknown if this fails
            return "?"
        if spec is None:
            return None
        return f"{spec.kind} range {spec.range_ms} ms" + (f" step {spec.step_ms} ms" if getattr(spec, "step_ms", None)
                                                           else "")


class Subscriber:
    """One SSE or WebSocket client of one query: woken (``wake()``) when the query's stream changes."""

    def __init__(self, query_id: str, kind: str, wake: Callable[[], None], version: int = 0,
                 cursor: int = 1) -> None:
        self.query_id, self.kind, self.wake = query_id, kind, wake
        self.version = version  # 0: the first registration that shows up
        self.cursor = cursor  # next answer number to send
        self.sequence = 0  # SEPA notifications sent
        self.stream: Stream | None = None  # the registration's stream being followed


class Hub:
    """Registered queries, their streams and their subscribers (used from one thread: the event loop)."""

    def __init__(self, history: int = 100_000) -> None:
        self.history = history
        self.plans: dict[str, QueryInfo] = {}
        self.streams: dict[str, Stream] = {}
        self.subscribers: dict[str, set[Subscriber]] = {}
        self.answers_read = 0
        self.last_answer_ms = 0
        self.plan_listeners: list[Callable[[str], None]] = []
        self.idle_listeners: list[Callable[[str], None]] = []  # called when a query's last subscriber leaves
        self.held: Callable[[str], bool] = lambda _query_id: True  # this replica keeps the query's answers

    # ------------------------------------------------------------------ input (from the topic reader)

    def apply_plan(self, query_id: str, plan: dict[str, Any] | None) -> None:
        if plan is None:
            self.plans.pop(query_id, None)
        else:
            info = QueryInfo.from_plan(plan)
            self.plans[query_id] = info
            if self.held(query_id):
                self._stream_for(query_id, info.version)
        for sub in self.subscribers.get(query_id, ()):
            sub.wake()
        for listener in self.plan_listeners:
            listener(query_id)

    def seed(self, current: dict[tuple[str, int], list[tuple[dict[str, Any], int]]]) -> None:
        """Start registrations from their current answers (``(query, version) -> [(binding, multiplicity)]``, read
        from answers.current) where retention deleted the older answers: the answers read after that are then
        numbered history, folded only from where the seed ends (``Answer.folded``)."""
        for (query_id, version), rows in current.items():
            stream = self._stream_for(query_id, version)
            if stream is not None:
                for binding, multiplicity in rows:
                    stream.current[binding_key(binding)] = [binding, multiplicity]

    def follow(self, query_id: str, version: int, rows: Iterable[tuple[dict[str, Any], int]]) -> Stream:
        """A new stream for a query another replica holds, from that replica's current answers ``rows`` (the
        answers relayed after it that ``rows`` already reflect come with ``Answer.folded`` False)."""
        stream = self.streams.get(query_id)
        if stream is None or stream.version != version or stream.answers:
            stream = self.streams[query_id] = Stream(query_id, version, self.history)
        stream.current = {}
        for binding, multiplicity in rows:
            stream.current[binding_key(binding)] = [binding, multiplicity]
        for sub in self.subscribers.get(query_id, ()):
            sub.wake()
        return stream

    def forget(self, query_id: str) -> None:
        """Drop a followed query's stream (nobody here subscribes to it any more)."""
        self.streams.pop(query_id, None)

    def sweep(self, keep_s: float, now: float | None = None) -> list[str]:
        """Drop the streams of the queries no longer registered that nobody subscribes to, once their last answer
        (the retractions that end them come after the unregistration) is ``keep_s`` old; the query ids dropped.
        Without it, every query ever registered here (each SEPA subscription's, say) kept its history for good."""
        now = time.monotonic() if now is None else now
        gone = [query_id for query_id, stream in self.streams.items()
                if query_id not in self.plans and not self.subscribers.get(query_id) and now - stream.touched >= keep_s]
        for query_id in gone:
            del self.streams[query_id]
        return gone

    def apply_answers(self, answers: Iterable[Answer]) -> None:
        touched: set[str] = set()
        for answer in answers:
            self.answers_read += 1
            self.last_answer_ms = max(self.last_answer_ms, answer.produced_at_ms)
            stream = self._stream_for(answer.query_id, answer.version)
            if stream is None:
                continue  # an older registration's answer: its stream was superseded
            if stream.add(answer):
                touched.add(answer.query_id)
        for query_id in touched:
            for sub in self.subscribers.get(query_id, ()):
                sub.wake()

    def _stream_for(self, query_id: str, version: int) -> Stream | None:
        stream = self.streams.get(query_id)
        if stream is None or version > stream.version:
            stream = self.streams[query_id] = Stream(query_id, version, self.history)
            return stream
        return stream if version == stream.version else None

    # ------------------------------------------------------------------ reading

    def stream(self, query_id: str) -> Stream | None:
        return self.streams.get(query_id)

    def registered(self, query_id: str) -> QueryInfo | None:
        return self.plans.get(query_id)

    def by_text(self, sparql: str) -> QueryInfo | None:
        """A registered query with exactly this text and no options (a SEPA subscription reuses it)."""
        for info in self.plans.values():
            if info.sparql == sparql and not info.options:
                return info
        return None

    def attach(self, sub: Subscriber) -> None:
        self.subscribers.setdefault(sub.query_id, set()).add(sub)

    def detach(self, sub: Subscriber) -> None:
        subs = self.subscribers.get(sub.query_id)
        if subs is not None:
            subs.discard(sub)
            if not subs:
                del self.subscribers[sub.query_id]
                for listener in self.idle_listeners:
                    listener(sub.query_id)

    def subscriber_count(self) -> Counter:
        return Counter(sub.kind for subs in self.subscribers.values() for sub in subs)

    def describe(self, query_id: str) -> dict[str, Any]:
        info = self.plans[query_id]
        stream = self.streams.get(query_id)
        if stream is not None and stream.version != info.version:
            stream = None
        return {"id": query_id, "status": "registered", "version": info.version, "sparql": info.sparql,
                "options": info.options, "class": info.query_class, "placement": info.placement,
                "window": info.window(), "projected": info.projected, "registered_at_seq": info.registered_at_seq,
                "answers": (stream.next_n - 1) if stream else 0,
                "current": sum(m for _b, m in stream.current.values()) if stream else 0,
                "subscribers": len(self.subscribers.get(query_id, ())), "held": self.held(query_id)}


# ---------------------------------------------------------------------------------------- wire formats


def results(variables: list[str], bindings: list[dict[str, Any]]) -> dict[str, Any]:
    return {"head": {"vars": variables}, "results": {"bindings": bindings}}


def net_change(answers: Iterable[Answer]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(added, removed) bindings: the net change of ``answers`` (a row added then removed is in neither)."""
    delta: dict[BindingKey, int] = {}
    bindings: dict[BindingKey, dict[str, Any]] = {}
    for answer in answers:
        key = answer.fold_key()
        bindings[key] = answer.binding
        delta[key] = delta.get(key, 0) + (1 if answer.sign == "+" else -1)
    added = [bindings[k] for k, d in delta.items() for _ in range(d) if d > 0]
    removed = [bindings[k] for k, d in delta.items() for _ in range(-d) if d < 0]
    return added, removed


def sepa_notification(spuid: str, alias: str | None, sequence: int, variables: list[str],
                      added: list[dict[str, Any]], removed: list[dict[str, Any]]) -> dict[str, Any]:
    """A SEPA notification (SPARQL 1.1 SE Protocol): sequence 0 is the reply to subscribe (current answers)."""
    note: dict[str, Any] = {"spuid": spuid, "sequence": sequence, "addedResults": results(variables, added),
                            "removedResults": results(variables, removed)}
    if alias is not None:
        note["alias"] = alias
    return {"notification": note}


def problem(status: int, detail: str, **extra: Any) -> dict[str, Any]:
    """RFC 9457 problem details of an HTTP error (``detail``: one line that says what and where)."""
    return {"type": "about:blank", "title": HTTPStatus(status).phrase, "status": status, "detail": detail, **extra}


def sepa_error(status: int, error: str, description: str) -> dict[str, Any]:
    """A SEPA error message (the broker's ErrorResponse JSON)."""
    return {"error": error, "status_code": status, "error_description": description}


def sse_event(data: str, event: str | None = None, event_id: str | None = None) -> bytes:
    """One server-sent event (``data`` must be one line: JSON without newlines is)."""
    head = (f"id: {event_id}\n" if event_id is not None else "") + (f"event: {event}\n" if event else "")
    return f"{head}data: {data}\n\n".encode()


# ---------------------------------------------------------------------------------------- auth


class TokenError(ValueError):
    pass


@dataclass(frozen=True)
class Grant:
    """Who a request is: its scope and the owner name its registrations are made under."""

    scope: str
    owner: str


class Tokens:
    """Bearer tokens, their scopes and owners.  ``read``: queries, answers, SSE, subscribing to registered queries,
    /query; ``read-write``: also /update, registering, unregistering and replacing its own queries, subscribing
    with a new query text; ``admin``: also other owners' queries.

    ``required`` is the default: a request without a known token is refused.  ``Tokens.none()`` (``--auth none``,
    an operator's explicit choice) lets everyone in as ``admin``."""

    def __init__(self, scopes: dict[str, str] | None = None, owners: dict[str, str] | None = None,
                 required: bool = True) -> None:
        self.scopes = dict(scopes or {})
        self.owners = dict(owners or {})
        self.required = required
        for token, scope in self.scopes.items():
            if scope not in SCOPES:
                raise TokenError(f"token scope {scope!r} is not one of {', '.join(SCOPES)}")
            if len(token) < 16:
                raise TokenError("a token must be at least 16 characters (generate one: openssl rand -hex 32)")

    @classmethod
    def none(cls) -> "Tokens":
        return cls(required=False)

    @classmethod
    def parse(cls, text: str) -> "Tokens":
        """``TOKEN SCOPE [OWNER]`` per line (``#`` comments), or ``TOKEN:SCOPE,TOKEN:SCOPE`` on one line, or a JSON
        object ``{"TOKEN": "SCOPE"}``.  A token without an owner name is owned by ``token-`` + a hash of it."""
        text = text.strip()
        if not text:
            return cls()
        if text.startswith("{"):
            try:
                return cls({str(k): str(v) for k, v in json.loads(text).items()})
            except ValueError as exc:
                raise TokenError(f"tokens: not JSON: {exc}") from None
        scopes: dict[str, str] = {}
        owners: dict[str, str] = {}
        for line in text.replace(",", "\n").splitlines():
            fields = line.split("#", 1)[0].replace(":", " ").split()
            if not fields:
                continue
            if len(fields) not in (2, 3):
                raise TokenError("tokens: expected 'TOKEN SCOPE [OWNER]' per line")
            scopes[fields[0]] = fields[1]
            if len(fields) == 3:
                owners[fields[0]] = fields[2]
        return cls(scopes, owners)

    @property
    def enabled(self) -> bool:
        return self.required

    def add(self, token: str, scope: str, owner: str | None = None) -> None:
        self.scopes[token] = scope
        if owner:
            self.owners[token] = owner

    def grant(self, token: str | None) -> Grant | None:
        """Who ``token`` is (None: unknown or missing); everyone is ``admin`` when no token is required."""
        if not self.required:
            return Grant(ADMIN, "anonymous")
        scope = self.scopes.get(token or "")
        if scope is None:
            return None
        owner = self.owners.get(token) or "token-" + hashlib.sha256(token.encode()).hexdigest()[:12]  # type: ignore
        return Grant(scope, owner)

    def scope(self, token: str | None) -> str | None:
        grant = self.grant(token)
        return grant.scope if grant is not None else None


def allows(scope: str | None, needed: str) -> bool:
    return scope in SCOPES and SCOPES.index(scope) >= SCOPES.index(needed)
