"""The gateway's Kafka-free parts: streams and their fold, SEPA notifications as sepy parses them, SSE framing,
token scopes, replicas' shares (no broker: these run in `make test-fast` too)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway.core import (ADMIN, READ, READ_WRITE, Answer, Hub, Share, Stream, Subscriber, TokenError, Tokens,
                                   allows, binding_key, net_change, sepa_notification, sse_event, subscription_id)


def ans(n: int, sign: str, x: str, version: int = 1, query: str = "q") -> Answer:
    return Answer(n, sign, {"x": {"type": "uri", "value": x}}, n, False, 1000 + n, version, query)


def test_stream_numbers_folds_and_drops_duplicates() -> None:
    s = Stream("q", 1, history=0)
    assert [s.add(a) for a in (ans(1, "+", "a"), ans(2, "+", "a"), ans(2, "+", "a"), ans(3, "+", "b"),
                               ans(4, "-", "a"))] == [True, True, False, True, True]
    assert s.next_n == 5 and s.duplicates == 1
    assert s.rows() == [{"x": {"type": "uri", "value": "a"}}, {"x": {"type": "uri", "value": "b"}}]
    assert [a.n for a in s.since(3)] == [3, 4]


def test_stream_keeps_the_last_history_answers() -> None:
    s = Stream("q", 1, history=3)
    for n in range(1, 8):
        s.add(ans(n, "+", f"v{n}"))
    assert s.base > 1 and s.next_n == 8
    assert [a.n for a in s.since(1)][-3:] == [5, 6, 7]
    assert len(s.rows()) == 7  # the fold keeps every answer, trimmed or not


def test_a_seeded_stream_folds_only_the_answers_past_its_seed() -> None:
    """Retention deleted answers 1-2 (+a, +b); the seed (answers.current) is the fold as of the cut after answer 3
    (+c): answer 3 is read as history but not folded again; the answers past the cut are."""
    def x(value: str) -> dict:
        return {"x": {"type": "uri", "value": value}}

    hub = Hub()
    hub.seed({("q", 1): [(x("a"), 1), (x("b"), 1), (x("c"), 1)]})
    below_cut = ans(3, "+", "c")
    below_cut.folded = False
    hub.apply_answers([below_cut])
    stream = hub.stream("q")
    assert stream.base == 3 and [a.n for a in stream.since(1)] == [3]  # the history starts where the log does
    assert stream.rows() == [x("a"), x("b"), x("c")]  # c once: answer 3 is in the seed
    hub.apply_answers([ans(4, "-", "a"), ans(5, "+", "d")])
    assert stream.rows() == [x("b"), x("c"), x("d")]


def test_net_change_cancels_within_a_notification() -> None:
    added, removed = net_change([ans(1, "+", "a"), ans(2, "-", "a"), ans(3, "+", "b"), ans(4, "-", "c")])
    assert added == [{"x": {"type": "uri", "value": "b"}}]
    assert removed == [{"x": {"type": "uri", "value": "c"}}]


def test_sepy_reads_our_notifications() -> None:
    from sepy.ConnectionHandler import parseWSMessage

    first = sepa_notification("sepa://subscription/1", "a", 0, ["x"], [{"x": {"type": "uri", "value": "a"}}], [])
    assert parseWSMessage(json.dumps(first)) == ("sepa://subscription/1", [{"x": {"type": "uri", "value": "a"}}], [])
    later = sepa_notification("sepa://subscription/1", "a", 3, ["x"], [], [{"x": {"type": "uri", "value": "a"}}])
    assert parseWSMessage(json.dumps(later)) == (None, [], [{"x": {"type": "uri", "value": "a"}}])
    assert parseWSMessage(json.dumps({"unsubscribed": {"spuid": "s"}})) == (None, None, None)


def test_hub_supersedes_a_stream_on_a_new_version_and_wakes_subscribers() -> None:
    hub = Hub()
    woken = []
    sub = Subscriber("q", "sse", lambda: woken.append(1))
    hub.attach(sub)
    hub.apply_answers([ans(1, "+", "a"), ans(2, "+", "b")])
    old = hub.stream("q")
    assert old is not None and old.next_n == 3 and woken
    hub.apply_answers([ans(1, "+", "c", version=2), ans(3, "-", "a", version=1)])  # old retraction: dropped
    assert hub.stream("q") is not old and hub.stream("q").version == 2 and hub.stream("q").next_n == 2
    hub.detach(sub)
    assert hub.subscriber_count() == {}


def test_a_share_is_read_from_its_flag_or_the_host_name_and_names_every_replica() -> None:
    assert Share.parse("1/3") == Share(1, 3) and Share.parse("host/3", "cbgp-gateway-2") == Share(2, 3)
    for bad, host in [("3/3", ""), ("1", ""), ("a/2", ""), ("host/2", "gateway"), ("-1/2", "")]:
        with pytest.raises(ValueError, match="--share"):
            Share.parse(bad, host)
    share = Share(1, 3)
    assert [share.owner(p) for p in range(6)] == [0, 1, 2, 0, 1, 2] and share.holds(4) and not share.holds(3)
    assert share.peers("http://gw-{i}.peers:8080") == [f"http://gw-{i}.peers:8080" for i in range(3)]
    assert share.peers("http://a:1, http://b:2/,https://c:3") == ["http://a:1", "http://b:2", "https://c:3"]
    for bad in ("http://a:1,http://b:2", "", "ftp://{i}"):
        with pytest.raises(ValueError, match="--peers"):
            share.peers(bad)


def test_an_answer_from_another_replica_is_checked_before_it_is_kept() -> None:
    good = ans(7, "-", "a")
    assert Answer.from_json(json.loads(good.encoded())).to_json() == good.to_json()
    for bad in ({}, [], {**good.to_json(), "n": 0}, {**good.to_json(), "sign": "*"},
                {**good.to_json(), "binding": "x"}, {**good.to_json(), "query": 3}):
        with pytest.raises(ValueError, match="not an answer"):
            Answer.from_json(bad)


def test_a_followed_stream_starts_from_the_holders_fold_and_keeps_its_numbers() -> None:
    """A replica follows a query it does not hold: the holder's current answers (as of answer 2), then its history
    (answers 1-2: not folded again) and what comes after."""
    def x(value: str) -> dict:
        return {"x": {"type": "uri", "value": value}}

    hub = Hub()
    hub.held = lambda query_id: query_id != "q"
    idle: list[str] = []
    hub.idle_listeners.append(idle.append)
    hub.apply_plan("q", {"query_id": "q", "sparql": "SELECT", "version": 1, "plan_json": "{}"})
    assert hub.stream("q") is None and hub.describe("q")["held"] is False
    stream = hub.follow("q", 1, [(x("b"), 2)])
    history = [ans(1, "+", "b"), ans(2, "+", "b")]
    for a in history:
        a.folded = False
    hub.apply_answers([*history, ans(3, "-", "b"), ans(4, "+", "c")])
    assert hub.stream("q") is stream and [a.n for a in stream.since(1)] == [1, 2, 3, 4]
    assert stream.rows() == [x("b"), x("c")]
    assert hub.follow("q", 1, [(x("d"), 1)]) is not stream  # seeded anew once it has answers: a new stream
    sub = Subscriber("q", "sse", lambda: None)
    hub.attach(sub)
    hub.detach(sub)
    assert idle == ["q"]
    hub.forget("q")
    assert hub.stream("q") is None


def test_sse_event_framing_and_subscription_ids() -> None:
    assert sse_event('{"n":1}', "answer", "1") == b'id: 1\nevent: answer\ndata: {"n":1}\n\n'
    assert subscription_id("SELECT *") == subscription_id("SELECT *") != subscription_id("SELECT ?x")


def test_tokens_scopes_and_owners() -> None:
    reader, writer, admin = "r" * 16, "w" * 16, "a" * 16
    tokens = Tokens.parse(f"# comment\n{reader} read\n{writer} read-write alice\n{admin} admin\n")
    assert tokens.scope(reader) == READ and tokens.scope(writer) == READ_WRITE and tokens.scope(admin) == ADMIN
    assert tokens.scope("x" * 16) is None and tokens.scope(None) is None
    assert tokens.grant(writer).owner == "alice" and tokens.grant(reader).owner.startswith("token-")
    assert Tokens.parse(f"{reader}:read,{writer}:read-write").scopes == {reader: READ, writer: READ_WRITE}
    assert Tokens.parse(f'{{"{reader}": "read"}}').scope(reader) == READ
    assert Tokens.parse("").scope(None) is None  # no tokens: nobody is let in (the server generates one)
    assert Tokens.none().scope(None) == ADMIN  # --auth none: an operator's explicit choice
    with pytest.raises(TokenError):
        Tokens.parse(f"{reader} superuser")
    with pytest.raises(TokenError, match="at least 16 characters"):
        Tokens.parse("abc read")
    assert allows(ADMIN, READ_WRITE) and not allows(READ_WRITE, ADMIN)
    assert allows(READ_WRITE, READ) and allows(READ, READ) and not allows(READ, READ_WRITE) and not allows(None, READ)


@pytest.mark.parametrize("flags, line", [
    (["--share", "3/2"], "cbgp gateway: error: --share 3/2: the index must be from 0 to 1"),
    (["--share", "1/2", "--peers", "http://a"], "cbgp gateway: error: --peers: expected 2 http(s) URLs"),
])
def test_a_bad_share_or_peers_flag_is_one_line_before_anything_starts(flags: list[str], line: str) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "services.commands.main", "gateway", "--auth", "none", *flags],
                          capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin"})
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert line in done.stderr.strip().splitlines()[-1]


_TERMS = st.one_of(
    st.builds(lambda v: {"type": "uri", "value": v}, st.sampled_from(["a", "b", "a b", ""])),
    st.builds(lambda v, d: {"type": "literal", "value": v, "datatype": d}, st.sampled_from(["1", "a", ""]),
              st.sampled_from(["http://www.w3.org/2001/XMLSchema#integer", "x"])),
    st.builds(lambda v, lang: {"type": "literal", "value": v, "xml:lang": lang}, st.sampled_from(["a", "1"]),
              st.sampled_from(["en", "de"])),
    st.builds(lambda v: {"type": "bnode", "value": v}, st.sampled_from(["b0", "a"])))
_BINDINGS = st.dictionaries(st.sampled_from(["x", "y", "z"]), _TERMS, max_size=3)


@settings(max_examples=300, deadline=None)
@given(_BINDINGS, _BINDINGS)
def test_two_bindings_fold_together_exactly_when_their_canonical_json_is_the_same(a: dict, b: dict) -> None:
    same_json = json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert (binding_key(a) == binding_key(b)) == same_json
    assert sorted([binding_key(a), binding_key(b)])  # always comparable


def test_a_binding_of_another_shape_from_a_peer_folds_and_sorts_beside_the_usual_ones() -> None:
    odd = [{"x": {"type": 1, "value": "a"}}, {"x": ["not", "a", "term"]}, {"x": {"value": "no type"}},
           {"x": {"type": "uri", "value": ["a"]}}, {"x": {"type": "uri", "value": "a"}, "y": None}]
    stream = Stream("q", 1, history=0)
    for n, binding in enumerate(odd + [{"x": {"type": "uri", "value": "a"}}], 1):
        assert stream.add(Answer(n, "+", binding, n, False, 0, 1, "q"))
    assert sorted(map(json.dumps, stream.rows())) == sorted(map(json.dumps, odd + [{"x": {"type": "uri", "value": "a"}}]))
    added, removed = net_change([Answer(1, "+", odd[0], 1, False, 0, 1, "q"), Answer(2, "-", odd[0], 2, False, 0, 1, "q")])
    assert added == removed == []


def test_an_unregistered_querys_stream_goes_once_nobody_reads_it_and_its_last_answer_is_old() -> None:
    """The retractions that end a registration come after its tombstone; then the stream (up to ``history``
    answers) is dropped, unless the query is registered again or someone still subscribes."""
    hub = Hub()
    for query in ("gone", "kept", "read"):
        hub.apply_plan(query, {"query_id": query, "sparql": "SELECT", "version": 1, "plan_json": "{}"})
        hub.apply_answers([ans(1, "+", "a", query=query)])
    sub = Subscriber("read", "sse", lambda: None)
    hub.subscribers["read"] = {sub}
    hub.apply_plan("gone", None)
    hub.apply_plan("read", None)
    hub.apply_answers([ans(2, "-", "a", query="gone")])  # the end of its stream
    now = hub.stream("gone").touched
    assert hub.sweep(60.0, now + 59.0) == [] and hub.stream("gone") is not None
    assert hub.sweep(60.0, now + 60.0) == ["gone"]
    assert hub.stream("gone") is None and hub.stream("kept") is not None and hub.stream("read") is not None
    hub.subscribers["read"].clear()
    assert hub.sweep(60.0, now + 61.0) == ["read"]
