"""A local view against a real SPARQL endpoint: Virtuoso (Debian's virtuoso-opensource, started on a
free port with its own database by cbgp.background.endpoint), and the pyoxigraph fallback.

Per endpoint (started once per module): the view is filled by one bulk SERVICE query through SPARQLWrapper, a
follower count changes on the endpoint through SPARQL Update, and the refresh that reads it reports the change.
"""

from __future__ import annotations

import pytest

from cbgp.background import LocalView, Maintainer, WindowShape
from cbgp.background.endpoint import start_endpoint, virtuoso_available
from cbgp.background.remote import SparqlRemote, literal_value

EX = "http://example.org/"
PATTERN = "?user <http://example.org/hasFollowers> ?followers"
USERS = [f"<{EX}user/{i}>" for i in range(50)]


def followers(rows):
    """The view value of one user: the follower count (one row: hasFollowers is functional)."""
    return literal_value(dict(rows[0])["followers"]) if rows else None


@pytest.fixture(scope="module", params=["virtuoso", "oxigraph"])
def endpoint(request):
    if request.param == "virtuoso" and not virtuoso_available():
        pytest.skip("virtuoso-opensource is not installed (make virtuoso)")
    with start_endpoint(request.param, writable=True) as running:
        remote = SparqlRemote(running.query_url, PATTERN, "user", update_endpoint=running.update_url,
                              value_of=followers)
        data = " ".join(f"{u} <{EX}hasFollowers> {1000 + i} ." for i, u in enumerate(USERS))
        remote.update(f"INSERT DATA {{ GRAPH <{EX}bkg> {{ {data} }} }}")
        yield running


def set_followers(remote: SparqlRemote, user: str, count: int) -> None:
    remote.update(f"DELETE {{ GRAPH <{EX}bkg> {{ {user} <{EX}hasFollowers> ?old }} }} "
                  f"INSERT {{ GRAPH <{EX}bkg> {{ {user} <{EX}hasFollowers> {count} }} }} "
                  f"WHERE {{ GRAPH <{EX}bkg> {{ {user} <{EX}hasFollowers> ?old }} }}")


def test_fill_refresh_sees_a_change_made_by_sparql_update(endpoint):
    remote = SparqlRemote(endpoint.query_url, PATTERN, "user", update_endpoint=endpoint.update_url,
                          value_of=followers)
    view = LocalView(prior_interval=5)
    view.fill(remote.fill(), 0)  # one bulk query
    assert len(view) == 50 and view.value(USERS[7]) == 1007 and remote.calls == 1

    set_followers(remote, USERS[7], 2222)
    assert remote.fetch(USERS[7]) == 2222  # one query for one key, no VALUES
    assert view.value(USERS[7]) == 1007  # the view is not refreshed behind our back

    window = {USERS[i]: 0.5 for i in (3, 7, 9)}
    maintainer = Maintainer(view, remote, "WSJ-LRU", WindowShape(omega=10, beta=1), gamma=3, rho=5.0)
    evaluation = maintainer.evaluate(1, window)
    assert sorted(evaluation.refreshed) == sorted(window)  # only window entries, one call each
    assert [(c.key, c.old, c.new) for c in evaluation.changes] == [(USERS[7], 1007, 2222)]
    assert evaluation.answers[USERS[7]] == 2222 and view.value(USERS[7]) == 2222
    assert evaluation.latency < 5.0 and maintainer.remote_calls == 3


def test_fetch_many_with_values(endpoint):
    remote = SparqlRemote(endpoint.query_url, PATTERN, "user", update_endpoint=endpoint.update_url,
                          value_of=followers)
    set_followers(remote, USERS[1], 31)
    assert remote.fetch_many([USERS[1], USERS[2], f"<{EX}user/nobody>"]) == {
        USERS[1]: 31, USERS[2]: 1002, f"<{EX}user/nobody>": None}


def test_service_query_answers_retract_and_reassert_after_the_refresh_that_sees_a_change(endpoint):
    """The path of a registered SERVICE query, without the broker: split the query, fill the view from the
    endpoint it names, join the stream's answers, change a follower count on the endpoint, refresh."""
    from cbgp.background.service_clause import BackgroundJoin, split_service

    query = (f"PREFIX ex: <{EX}>\nSELECT ?user ?followers WHERE {{ ?post ex:mentions ?user . "
             f"SERVICE <{endpoint.query_url}> {{ ?user ex:hasFollowers ?followers }} }}")
    plan = split_service(query)
    (service,) = plan.services
    assert plan.maintenance == "budgeted"
    remote = SparqlRemote(service.endpoint, service.pattern, service.join_vars[0], prefixes=plan.prologue,
                          update_endpoint=endpoint.update_url)  # default values: sets of result rows
    view = LocalView(prior_interval=5)
    view.fill(remote.fill(), 0)
    assert all(len(view.value(k)) == 1 for k in view)  # one background mapping per key: the 1:1 class
    join = BackgroundJoin(view, "user", projected=plan.projected)
    inserted = join.local_delta({"post": f"<{EX}post/1>", "user": USERS[20]}, +1)
    (sign, answer), = inserted
    assert sign == 1 and dict(answer)["user"] == USERS[20]
    old = dict(answer)["followers"]

    set_followers(remote, USERS[20], 777)
    maintainer = Maintainer(view, remote, "WSJ-WBM", WindowShape(omega=10, beta=1), gamma=1, rho=5.0)
    evaluation = maintainer.evaluate(1, {USERS[20]: 0.5})
    deltas = [d for change in evaluation.changes for d in join.refresh_change(change)]
    new = '"777"^^<http://www.w3.org/2001/XMLSchema#integer>'
    assert deltas == [(-1, (("followers", old), ("user", USERS[20]))), (1, (("followers", new), ("user", USERS[20])))]
    assert list(join.answers()) == [(("followers", new), ("user", USERS[20]))]


def test_service_query_with_the_engine(endpoint):
    """ServiceQuery: the engine answers the local part, the view the SERVICE part; a follower count changed on
    the endpoint retracts and re-asserts the answers of that user at the next maintenance round."""
    from cbgp.background.service_query import ServiceQuery
    from cbgp.engine.engine import Engine

    query = (f"PREFIX ex: <{EX}>\nSELECT ?user ?followers WHERE {{ ?post ex:mentions ?user . "
             f"SERVICE <{endpoint.query_url}> {{ ?user ex:hasFollowers ?followers }} }}")
    sq = ServiceQuery(query, {"service.policy": "WSJ-WBM", "service.rho_ms": "2000", "service.refresh_ms": "1000",
                              "service.alpha": "0.5"})
    engine = Engine()
    engine.register("q", sq.local_text)

    def mention(post: str, user: str) -> list:
        deltas = engine.apply_terms(1, f"<{EX}post/{post}>", f"<{EX}mentions>", user)
        return sq.local_deltas(500, [(sign, engine.decode_row("q", row)) for _, sign, row in deltas])

    integer = "^^<http://www.w3.org/2001/XMLSchema#integer>"
    assert mention("a", USERS[30]) == [(1, (("followers", f'"1030"{integer}'), ("user", USERS[30])))]
    assert mention("b", USERS[31]) == [(1, (("followers", f'"1031"{integer}'), ("user", USERS[31])))]
    assert mention("c", f"<{EX}user/999>") == []  # not on the endpoint (yet): no answer

    set_followers(SparqlRemote(endpoint.query_url, PATTERN, "user", update_endpoint=endpoint.update_url),
                  USERS[30], 4242)
    deltas, evaluation = sq.evaluate(1000)
    assert sorted(evaluation.refreshed) == sorted([USERS[30], USERS[31], f"<{EX}user/999>"])
    assert deltas == [(-1, (("followers", f'"1030"{integer}'), ("user", USERS[30]))),
                      (1, (("followers", f'"4242"{integer}'), ("user", USERS[30])))]
    status = sq.status()
    assert status["maintenance"] == "budgeted" and status["policy"] == "WSJ-WBM"
    assert status["remote_calls"] == 4 and status["estimated_accuracy"] == 1.0 and status["alerts"] == 0


@pytest.mark.parametrize("kind", ["oxigraph", pytest.param("virtuoso", marks=pytest.mark.skipif(
    not virtuoso_available(), reason="virtuoso-opensource is not installed (make virtuoso)"))])
def test_a_read_only_endpoint_refuses_updates_over_http_and_listens_on_loopback_only(kind: str) -> None:
    import socket
    import urllib.error
    import urllib.parse
    import urllib.request

    with start_endpoint(kind) as endpoint:
        endpoint.update(f"INSERT DATA {{ GRAPH <{EX}bkg> {{ <{EX}u1> <{EX}hasFollowers> 3 }} }}")  # the owner's channel
        body = urllib.parse.urlencode({"update": f"INSERT DATA {{ GRAPH <{EX}bkg> {{ <{EX}u2> <{EX}hasFollowers> 9 }} }}"}).encode()
        request = urllib.request.Request(endpoint.update_url, body,
                                         {"Content-Type": "application/x-www-form-urlencoded"})
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(request, timeout=10)
        rows = SparqlRemote(endpoint.query_url, f"?user <{EX}hasFollowers> ?n", "user").fill()
        assert list(rows) == [f"<{EX}u1>"]
        port = urllib.parse.urlsplit(endpoint.query_url).port
        address = socket.gethostbyname(socket.gethostname())
        if address != "127.0.0.1":  # another interface of this machine: nothing listens there
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=2).close()


@pytest.mark.parametrize("length, reason", [("ten", "is not a number of bytes"), ("-5", "is not a number of bytes"),
                                            ("99999999999", "over the limit")])
def test_the_oxigraph_endpoint_answers_a_bad_content_length_with_one_line_and_goes_on(length: str, reason: str) -> None:
    """The length a client claims is never trusted: not a number, or more than an update may be, is a 400 naming
    it (the body is not read), the connection closes, and the next request is answered."""
    import http.client
    import urllib.parse

    with start_endpoint("oxigraph") as endpoint:
        url = urllib.parse.urlsplit(endpoint.query_url)
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        connection.putrequest("POST", url.path)
        connection.putheader("Content-Type", "application/sparql-query")
        connection.putheader("Content-Length", length)
        connection.endheaders()
        reply = connection.getresponse()
        assert reply.status == 400 and reason in reply.read().decode()
        connection.close()
        rows = SparqlRemote(endpoint.query_url, f"?user <{EX}hasFollowers> ?n", "user").fill()
        assert list(rows) == []
