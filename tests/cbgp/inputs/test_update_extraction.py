"""SPARQL 1.1 Update delta extraction (cbgp.inputs.sparql_update), proved against things we did not write.

1. The W3C SPARQL 1.1 Update test suites (tests/data/w3c-update, one case per W3C test):
   the store after `apply` equals the expected post-state (up to blank-node renaming
   when blank nodes occur), and the reported delta is exactly post-state minus
   pre-state (inserted) and pre-state minus post-state (deleted).  Negative syntax
   tests must raise a syntax UpdateRequestError; positive ones must not.
   Out of scope (and asserted as such): the two LOAD tests, since LOAD is rejected
   by design.  `test_w3c_scope_counts` pins how many tests are in scope.  Each evaluation test runs again with
   every WHERE clause read in a bounded forked child, as ingest reads one that may run away.
2. Differential (hypothesis): random multi-operation requests applied by `apply` on
   one store and by pyoxigraph's own `Store.update` on another.
3. Atomicity: a failing operation k leaves the store as it was and names k.
4. The worked examples T004-1..5 of reference/analysis-002-004.md section 3.5.
"""

from __future__ import annotations

from pathlib import Path

import pyoxigraph as ox
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rdflib import RDF, RDFS, Graph, Namespace
from rdflib.collection import Collection

from cbgp.terms import from_oxigraph
from cbgp.inputs.sparql_update import UpdateDelta, UpdateExtractor, UpdateRequestError

W3C = Path(__file__).parents[2] / "data" / "w3c-update"
SUITES = ["basic-update", "delete-insert", "delete-where", "delete-data", "delete", "clear", "drop", "add",
          "move", "copy", "update-silent", "syntax-update-1"]
MF = Namespace("http://www.w3.org/2001/sw/DataAccess/tests/test-manifest#")
UT = Namespace("http://www.w3.org/2009/sparql/tests/test-update#")
OUT_OF_SCOPE = {
    "update-silent/LOAD SILENT": "LOAD is rejected by design (the processor never dereferences URLs)",
    "update-silent/LOAD SILENT INTO": "LOAD is rejected by design (the processor never dereferences URLs)",
}


def _key(q: ox.Quad) -> tuple:
    g = None if isinstance(q.graph_name, ox.DefaultGraph) else from_oxigraph(q.graph_name)
    return (from_oxigraph(q.subject), from_oxigraph(q.predicate), from_oxigraph(q.object), g)


def _keys(store: ox.Store) -> set[tuple]:
    return {_key(q) for q in store}


def _has_bnode(keys: set[tuple]) -> bool:
    return any(t is not None and t.startswith("_:") for k in keys for t in k)


def _canonical(store: ox.Store) -> set[tuple]:
    ds = ox.Dataset(list(store))
    ds.canonicalize(ox.CanonicalizationAlgorithm.RDFC_1_0)
    return {_key(q) for q in ds}


def _load(store: ox.Store, node, manifest: Graph) -> None:  # noqa: ANN001
    """Load the ut:data / ut:graphData of a manifest action or result into `store`."""
    if node is None:
        return
    for data in manifest.objects(node, UT.data):
        store.load(path=Path(str(data).removeprefix("file://")), format=ox.RdfFormat.TURTLE, base_iri=str(data))
    for graph_data in manifest.objects(node, UT.graphData):
        data = manifest.value(graph_data, UT.graph)
        label = str(manifest.value(graph_data, RDFS.label))
        store.load(path=Path(str(data).removeprefix("file://")), format=ox.RdfFormat.TURTLE, base_iri=str(data),
                   to_graph=ox.NamedNode(label))


def _w3c_cases() -> list:
    cases = []
    for suite in SUITES:
        path = W3C / suite / "manifest.ttl"
        manifest = Graph().parse(path, format="turtle", publicID=path.as_uri())
        root = next(manifest.subjects(RDF.type, MF.Manifest))
        for entry in Collection(manifest, manifest.value(root, MF.entries)):
            kind = str(manifest.value(entry, RDF.type)).rsplit("#", 1)[1]
            name = f"{suite}/{manifest.value(entry, MF.name)}"
            cases.append(pytest.param(kind, name, entry, manifest, id=name))
    return cases


W3C_CASES = _w3c_cases()
# Each case as the extractor reads it here, and each evaluation case again in a child (``isolated``): forked
# from a graph in memory, and started anew on a checkpoint of a graph on disk
W3C_RUNS = [pytest.param(*case.values, None, id=case.id) for case in W3C_CASES] + [
    pytest.param(*case.values, where, id=f"{case.id} {where}") for case in W3C_CASES
    if case.values[0] == "UpdateEvaluationTest" for where in ("in a child", "on disk in a child")]


def assert_delta_matches(pre: set[tuple], delta: UpdateDelta, after: set[tuple]) -> None:
    """The delta is a real change of `pre` that yields `after`, with no duplicates."""
    inserted, deleted = set(delta.inserted), set(delta.deleted)
    assert len(inserted) == len(delta.inserted) and len(deleted) == len(delta.deleted)
    assert deleted <= pre, "reported as deleted but was absent"
    assert not inserted & pre, "reported as inserted but was present"
    assert (pre - deleted) | inserted == after


@pytest.mark.parametrize("kind,name,entry,manifest,isolated", W3C_RUNS)
def test_w3c_update(kind: str, name: str, entry, manifest: Graph, isolated: str | None,  # noqa: ANN001
                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``in a child``: every WHERE clause read as ingest reads one that may run away, in a bounded child
    (``services.ingest.where``), its solutions sent back; ``on disk``: the graph is a RocksDB store, read from a
    checkpoint by a new interpreter."""
    path = tmp_path / "graph" if isolated == "on disk in a child" else None
    extractor = UpdateExtractor
    if isolated:
        from cbgp.inputs import sparql_update
        from services.ingest.where import isolation
        from services.state.forked import CAN_BOUND

        if not CAN_BOUND:
            pytest.skip("a bounded child is forked on Linux only")
        monkeypatch.setattr(sparql_update, "may_run_away", lambda _where: True)
        extractor = lambda store: UpdateExtractor(store, isolate=isolation(store, path))  # noqa: E731
    action = manifest.value(entry, MF.action)
    if kind in ("NegativeSyntaxTest11", "NegativeUpdateSyntaxTest11", "PositiveUpdateSyntaxTest11"):
        request_file = Path(str(action).removeprefix("file://"))
        request = request_file.read_text(encoding="utf-8")
        store = ox.Store()
        try:
            extractor(store).apply(request, base=str(action))
            error = None
        except UpdateRequestError as exc:
            error = exc
        if kind.startswith("Negative"):
            assert error is not None and error.syntax, f"{name}: a syntax error was not reported"
            assert "syntax error" in str(error) and "\n" not in str(error)
        else:
            assert error is None or not error.syntax, f"{name}: valid syntax rejected: {error}"
        return
    assert kind == "UpdateEvaluationTest", kind
    request_iri = manifest.value(action, UT.request)
    request = Path(str(request_iri).removeprefix("file://")).read_text(encoding="utf-8")
    store, expected = ox.Store(None if path is None else str(path)), ox.Store()
    _load(store, action, manifest)
    _load(expected, manifest.value(entry, MF.result), manifest)
    if name in OUT_OF_SCOPE:
        with pytest.raises(UpdateRequestError, match="LOAD is not supported"):
            extractor(store).apply(request, base=str(request_iri))
        return
    pre = _keys(store)
    delta = extractor(store).apply(request, base=str(request_iri))
    after, wanted = _keys(store), _keys(expected)
    assert_delta_matches(pre, delta, after)
    if _has_bnode(after | wanted | pre):
        assert _canonical(store) == _canonical(expected)
    else:
        assert after == wanted
        assert set(delta.inserted) == wanted - pre
        assert set(delta.deleted) == pre - wanted


def test_w3c_scope_counts() -> None:
    kinds = [c.values[0] for c in W3C_CASES]
    evaluation = kinds.count("UpdateEvaluationTest")
    syntax = len(kinds) - evaluation
    # 155 W3C tests: 93 evaluation tests (91 in scope, the 2 LOAD ones out of scope)
    # and 62 syntax tests (41 positive, 21 negative).
    assert (evaluation, syntax, len(OUT_OF_SCOPE)) == (93, 62, 2)
    assert sum(k.startswith("Negative") for k in kinds) == 21


# -- the paper's worked examples (analysis-002-004.md section 3.5) ----------------------------

FOAF = "PREFIX foaf: <http://xmlns.com/foaf/0.1/>\n"
NAME = "<http://xmlns.com/foaf/0.1/name>"


def _paper_store() -> tuple[ox.Store, UpdateExtractor]:
    store = ox.Store()
    store.update(FOAF + """INSERT DATA {
        GRAPH <http://g1> { <http://p1> foaf:name "Pietro" ; foaf:familyName "Rossi" . <http://p2> foaf:name "Mario" }
        GRAPH <http://g2> { <http://p3> foaf:name "Pietro" , "Mario" } }""")
    return store, UpdateExtractor(store)


def test_t004_1_graph_variable_rename_reports_only_real_changes() -> None:
    store, extractor = _paper_store()
    delta = extractor.apply(FOAF + """DELETE { GRAPH ?g { ?a foaf:name "Pietro" } }
        INSERT { GRAPH ?g { ?a foaf:name "Mario" } } WHERE { GRAPH ?g { ?a foaf:name "Pietro" } }""")
    assert set(delta.deleted) == {("<http://p1>", NAME, '"Pietro"', "<http://g1>"),
                                  ("<http://p3>", NAME, '"Pietro"', "<http://g2>")}
    assert delta.inserted == [("<http://p1>", NAME, '"Mario"', "<http://g1>")]


def test_t004_2_inserting_a_present_quad_reports_nothing() -> None:
    store, extractor = _paper_store()
    delta = extractor.apply(FOAF + 'INSERT DATA { GRAPH <http://g1> { <http://p2> foaf:name "Mario" } }')
    assert delta == UpdateDelta([], [])


def test_t004_3_delete_and_reinsert_of_the_same_quad_nets_to_nothing() -> None:
    store, extractor = _paper_store()
    store.update(FOAF + 'INSERT DATA { <http://p1> foaf:name "Pietro" }')
    delta = extractor.apply(FOAF + """DELETE { ?a foaf:name "Pietro" } INSERT { ?a foaf:name "Pietro" }
        WHERE { ?a foaf:name "Pietro" }""")
    assert delta == UpdateDelta([], [])
    assert ox.Quad(ox.NamedNode("http://p1"), ox.NamedNode(NAME[1:-1]), ox.Literal("Pietro")) in store


def test_t004_4_copy_onto_an_overlapping_graph_reports_the_net_change() -> None:
    store = ox.Store()
    store.update("""INSERT DATA { GRAPH <http://src> { <http://t1> <http://p> 1 . <http://t2> <http://p> 2 }
                                  GRAPH <http://tgt> { <http://t2> <http://p> 2 . <http://t3> <http://p> 3 } }""")
    delta = UpdateExtractor(store).apply("COPY <http://src> TO <http://tgt>")
    integer = "^^<http://www.w3.org/2001/XMLSchema#integer>"
    assert delta.deleted == [("<http://t3>", "<http://p>", '"3"' + integer, "<http://tgt>")]
    assert delta.inserted == [("<http://t1>", "<http://p>", '"1"' + integer, "<http://tgt>")]


def test_t004_5_move_deletes_source_and_old_target_and_inserts_source_into_target() -> None:
    store = ox.Store()
    store.update("""INSERT DATA { GRAPH <http://src> { <http://t1> <http://p> <http://o> }
                                  GRAPH <http://tgt> { <http://t2> <http://p> <http://o> } }""")
    delta = UpdateExtractor(store).apply("MOVE <http://src> TO <http://tgt>")
    assert set(delta.deleted) == {("<http://t1>", "<http://p>", "<http://o>", "<http://src>"),
                                  ("<http://t2>", "<http://p>", "<http://o>", "<http://tgt>")}
    assert delta.inserted == [("<http://t1>", "<http://p>", "<http://o>", "<http://tgt>")]


@pytest.mark.parametrize("request_text", [
    # deleted by operation 1, re-inserted by operation 2
    'DELETE DATA { GRAPH <http://g1> { <http://p2> foaf:name "Mario" } } ;'
    ' INSERT DATA { GRAPH <http://g1> { <http://p2> foaf:name "Mario" } }',
    # inserted by operation 1 (absent before), deleted again by operation 2
    'INSERT DATA { <http://p9> foaf:name "Nobody" } ; DELETE WHERE { ?a foaf:name "Nobody" }',
    # the graph emptied then refilled with the same triples
    "COPY <http://g1> TO <http://tmp> ; CLEAR GRAPH <http://g1> ; ADD <http://tmp> TO <http://g1> ; DROP GRAPH <http://tmp>",
])
def test_changes_undone_later_in_the_request_are_not_reported(request_text: str) -> None:
    store, extractor = _paper_store()
    before = _keys(store)
    assert extractor.apply(FOAF + request_text) == UpdateDelta([], [])
    assert _keys(store) == before


# -- atomicity and bad input ---------------------------------------------------------------------

def _state(store: ox.Store) -> tuple[set[tuple], set]:
    return _keys(store), set(store.named_graphs())


@pytest.mark.parametrize("request_text,failing", [
    ("INSERT DATA { <http://a> <http://p> <http://new> } ; CREATE GRAPH <http://g1>", 2),
    ("DELETE WHERE { GRAPH ?g { ?s ?p ?o } } ; DROP GRAPH <http://missing>", 2),
    ("MOVE <http://g1> TO <http://g9> ; CREATE GRAPH <http://g8> ; CLEAR GRAPH <http://missing>", 3),
    ("DROP ALL ; CREATE GRAPH <http://g5> ; CREATE GRAPH <http://g5>", 3),
])
def test_failing_operation_leaves_store_unchanged_and_is_named(request_text: str, failing: int) -> None:
    store, extractor = _paper_store()
    store.update("CREATE GRAPH <http://empty>")
    before = _state(store)
    with pytest.raises(UpdateRequestError, match=f"operation {failing} ") as info:
        extractor.apply(request_text)
    assert info.value.operation == failing and not info.value.syntax
    assert _state(store) == before


def test_syntax_error_names_line_column_and_operation() -> None:
    store, extractor = _paper_store()
    before = _state(store)
    with pytest.raises(UpdateRequestError, match=r"line 2, column \d+ \(operation 2\)") as info:
        extractor.apply("INSERT DATA { <http://a> <http://p> 1 } ;\nINSERT DATA { <http://a> <http://p> ?x }")
    assert info.value.syntax and info.value.line == 2 and info.value.operation == 2
    assert _state(store) == before


@pytest.mark.parametrize("request_text,message", [
    ("CLEAR DEFAULT ; LOAD <http://example.org/data.ttl>", "operation 2: LOAD is not supported"),
    ("INSERT { ?s ?p ?o } WHERE { SERVICE <http://example.org/sparql> { ?s ?p ?o } }",
     "operation 1: SERVICE is not supported"),
])
def test_remote_operations_are_rejected_before_anything_runs(request_text: str, message: str) -> None:
    store, extractor = _paper_store()
    before = _state(store)
    with pytest.raises(UpdateRequestError, match=message):
        extractor.apply(request_text)
    assert _state(store) == before


def test_template_blank_nodes_are_fresh_per_solution_and_reported_as_stored() -> None:
    store, extractor = _paper_store()
    delta = extractor.apply(FOAF + """INSERT { GRAPH ?g { _:card foaf:holder ?a } GRAPH <http://cards> { _:card a foaf:Card } }
        WHERE { GRAPH ?g { ?a foaf:name ?n } }""")
    holders = [q for q in delta.inserted if q[1].endswith("holder>")]
    cards = {q[0] for q in delta.inserted if q[3] == "<http://cards>"}
    assert len(holders) == 4 and {q[0] for q in holders} == cards and len(cards) == 4
    assert set(delta.inserted) <= _keys(store)


def test_prefixed_and_relative_graph_names_resolve_like_pyoxigraph(tmp_path: Path) -> None:
    request = """BASE <http://base.example/dir/>
PREFIX : <http://ex/>
INSERT DATA { GRAPH <g> { <s> :p "x" } GRAPH :h { <s> :p "y" } } ;
WITH <g> DELETE { <s> :p ?o } INSERT { <t> :p ?o } WHERE { <s> :p ?o } ;
COPY GRAPH :h TO <k> ; MOVE <k> TO :m ; ADD :m TO DEFAULT"""
    ours = ox.Store(path=str(tmp_path / "store"))  # the extractor works on an on-disk store too
    reference = ox.Store()
    delta = UpdateExtractor(ours).apply(request)
    reference.update(request)
    assert _state(ours) == _state(reference)
    assert set(delta.inserted) == _keys(reference) and delta.deleted == []
    assert ("<http://base.example/dir/t>", "<http://ex/p>", '"x"', "<http://base.example/dir/g>") in delta.inserted


def test_base_argument_resolves_relative_iris() -> None:
    store = ox.Store()
    delta = UpdateExtractor(store).apply("INSERT DATA { GRAPH <g> { <s> <p> <o> } }", base="http://b.example/")
    assert delta.inserted == [("<http://b.example/s>", "<http://b.example/p>", "<http://b.example/o>",
                               "<http://b.example/g>")]


# -- differential against pyoxigraph's own Store.update -----------------------------------------

EX = "http://ex/"
SUBJECTS = [f"<{EX}s{i}>" for i in range(3)]
PREDICATES = [f"<{EX}p>", f"<{EX}q>"]
OBJECTS = SUBJECTS[:2] + ['"a"', '"b"@en', "1", '"1"']
GRAPHS = [None, f"<{EX}g1>", f"<{EX}g2>"]


def _triples(draw, n: tuple[int, int] = (1, 3), vars_: bool = False) -> str:  # noqa: ANN001
    """Triples over the small vocabulary; with `vars_`, each position is a variable half the time
    so that WHERE patterns match often and templates share their variables."""
    def pick(constants: list[str], variables: list[str]) -> str:
        return draw(st.sampled_from(variables)) if vars_ and draw(st.booleans()) else draw(st.sampled_from(constants))

    triples = [(pick(SUBJECTS, ["?x"]), pick(PREDICATES, ["?p"]), pick(OBJECTS, ["?x", "?y"]))
               for _ in range(draw(st.integers(*n)))]
    return " . ".join(" ".join(t) for t in triples)


def _quads_block(draw, vars_: bool = False, graph_var: bool = False) -> str:  # noqa: ANN001
    parts = []
    for _ in range(draw(st.integers(1, 2))):
        graph = draw(st.sampled_from(GRAPHS + (["?g"] if graph_var else [])))
        body = _triples(draw, vars_=vars_)
        parts.append(body if graph is None else f"GRAPH {graph} {{ {body} }}")
    return "{ " + " . ".join(parts) + " }"


def _graph_ref(draw, keyword: bool) -> str:  # noqa: ANN001
    g = draw(st.sampled_from(GRAPHS))
    return "DEFAULT" if g is None else (f"GRAPH {g}" if keyword else g)


@st.composite
def operations(draw) -> str:  # noqa: ANN001
    kind = draw(st.sampled_from(["INSERT DATA", "DELETE DATA", "MODIFY", "MODIFY", "MODIFY", "DELETE WHERE",
                                 "CLEAR", "DROP", "ADD", "MOVE", "COPY", "CREATE"]))
    silent = draw(st.sampled_from(["", "SILENT "]))
    if kind in ("INSERT DATA", "DELETE DATA"):
        return f"{kind} {_quads_block(draw)}"
    if kind == "DELETE WHERE":
        return f"DELETE WHERE {_quads_block(draw, vars_=True, graph_var=True)}"
    if kind in ("CLEAR", "DROP"):
        target = draw(st.sampled_from(["DEFAULT", "NAMED", "ALL", f"GRAPH <{EX}g1>", f"GRAPH <{EX}g2>"]))
        return f"{kind} {silent}{target}"
    if kind in ("ADD", "MOVE", "COPY"):
        return f"{kind} {silent}{_graph_ref(draw, False)} TO {_graph_ref(draw, False)}"
    if kind == "CREATE":
        return f"CREATE {silent}GRAPH {draw(st.sampled_from(GRAPHS[1:]))}"
    with_ = draw(st.sampled_from(["", f"WITH <{EX}g1> "]))
    using = draw(st.sampled_from(["", "", f"USING <{EX}g2> ", f"USING <{EX}g1> USING NAMED <{EX}g2> "]))
    shape = draw(st.sampled_from(["DI", "D", "I"]))
    delete = "DELETE " + _quads_block(draw, vars_=True, graph_var=True) if "D" in shape else ""
    insert = "INSERT " + _quads_block(draw, vars_=True, graph_var=True) if "I" in shape else ""
    where = _quads_block(draw, vars_=True, graph_var=True)
    event(f"operation {kind}{' WITH' if with_ else ''}{' USING' if using else ''}")
    return f"{with_}{delete} {insert} {using}WHERE {where}"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(initial=st.lists(st.tuples(st.sampled_from(SUBJECTS), st.sampled_from(PREDICATES),
                                  st.sampled_from(OBJECTS), st.sampled_from(GRAPHS)), max_size=12),
       ops=st.lists(operations(), min_size=1, max_size=3))
def test_differential_against_pyoxigraph_update(initial: list[tuple], ops: list[str]) -> None:
    data = " ".join(f"GRAPH {g} {{ {s} {p} {o} }}" if g else f"{s} {p} {o} ." for s, p, o, g in initial)
    request = " ;\n".join(ops)
    ours, reference = ox.Store(), ox.Store()
    for store in (ours, reference):
        store.update(f"INSERT DATA {{ {data} }}")
    pre = _state(reference)
    try:
        reference.update(request)
    except (RuntimeError, OSError):
        event("request fails")
        with pytest.raises(UpdateRequestError, match="operation"):
            UpdateExtractor(ours).apply(request)
        assert _state(ours) == pre
        return
    delta = UpdateExtractor(ours).apply(request)
    event(f"delta {'non-empty' if delta.inserted or delta.deleted else 'empty'}")
    event(f"{len(ops)} operation(s)")
    assert _state(ours) == _state(reference)
    after = _keys(reference)
    assert set(delta.inserted) == after - pre[0]
    assert set(delta.deleted) == pre[0] - after
    assert_delta_matches(pre[0], delta, after)
