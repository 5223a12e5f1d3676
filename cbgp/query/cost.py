"""Cross products: graph patterns whose parts share no variable, so that every solution of one is joined with
every solution of the other (|G|^k solutions for k unconstrained parts).

A part is *unconstrained* when none of its triple patterns has a constant subject or object: it matches a whole
predicate, or the whole graph.  A product of two or more unconstrained parts costs the square of the graph or
more; a registered query or an update's WHERE clause that is one is refused unless asked for explicitly.  A
product with at most one unconstrained part (``?a foaf:name "Alan"`` times anything) costs what that part costs,
and passes."""

from __future__ import annotations

from typing import Any, Callable, Iterable

from rdflib.term import Variable


def _is_variable(term: Any) -> bool:
    return isinstance(term, Variable)


def _variables(triple: Iterable[Any], is_variable: Callable[[Any], bool] = _is_variable) -> set[str]:
    return {str(term) for term in triple if is_variable(term)}


def _anchored(triple: tuple, is_variable: Callable[[Any], bool] = _is_variable) -> bool:
    """A constant subject or object: the pattern matches the neighbourhood of one term, not a predicate."""
    return not is_variable(triple[0]) or not is_variable(triple[2])


def _components(triples: list[tuple], is_variable: Callable[[Any], bool] = _is_variable) -> list[tuple[set[str], bool]]:
    """``(variables, anchored)`` of the connected groups of ``triples`` (patterns without a variable join
    nothing); a group is anchored when one of its patterns is."""
    groups: list[tuple[set[str], bool]] = []
    for triple in triples:
        variables = _variables(triple, is_variable)
        if not variables:
            continue
        touching = [g for g in groups if g[0] & variables]
        merged = set(variables).union(*(g[0] for g in touching))
        anchored = _anchored(triple, is_variable) or any(g[1] for g in touching)
        groups = [g for g in groups if not g[0] & variables] + [(merged, anchored)]
    return groups


def _node_variables(node: Any) -> tuple[set[str], bool]:
    """The variables of a pattern's triples, and whether one of its triples is anchored."""
    found: set[str] = set()
    anchored = False
    stack = [node]
    while stack:
        item = stack.pop()
        if getattr(item, "name", None) == "BGP":
            for triple in item.get("triples", ()):
                found |= _variables(triple)
                anchored = anchored or _anchored(triple)
        elif hasattr(item, "items"):
            stack.extend(v for _k, v in item.items() if hasattr(v, "items") or isinstance(v, list))
        elif isinstance(item, list):
            stack.extend(v for v in item if hasattr(v, "items"))
    return found, anchored


def _shown(variables: set[str]) -> str:
    return "{" + " ".join(sorted("?" + v for v in variables)) + "}"


def _named_variable(term: str) -> bool:
    return term.startswith("?") and not term.startswith("?_:")  # (a blank node is a term to rdflib's algebra)


def _groups_shown(groups: list[set[str]]) -> str:
    """The first three variable groups in sorted order: both checks name the same three of a larger product."""
    return " and ".join(sorted(_shown(g) for g in groups)[:3])


def bgp_cross_product(patterns: Iterable[tuple[str, str, str]]) -> str | None:
    """:func:`cross_product` of one BGP given as canonical terms (``cbgp.query.sparql.TriplePattern``), without
    rdflib's algebra: a registration of a plain BGP is checked without a second parse."""
    loose = [{v[1:] for v in variables} for variables, anchored in _components(list(patterns), _named_variable)
             if not anchored]
    return _groups_shown(loose) if len(loose) > 1 else None


def cross_product(algebra: Any) -> str | None:
    """A description of the first product of two or more unconstrained parts in an rdflib algebra tree (a BGP of
    several variable groups, or a join of two patterns with no variable in common), or None."""
    stack = [algebra]
    while stack:
        node = stack.pop()
        name = getattr(node, "name", None)
        if name == "BGP":
            loose = [variables for variables, anchored in _components(list(node.get("triples", ()))) if not anchored]
            if len(loose) > 1:
                return _groups_shown(loose)
        elif name == "Join":
            (left, left_anchored), (right, right_anchored) = _node_variables(node["p1"]), _node_variables(node["p2"])
            if left and right and not left & right and not left_anchored and not right_anchored:
                return f"{_shown(left)} and {_shown(right)}"
        if hasattr(node, "items"):
            stack.extend(v for _k, v in node.items() if hasattr(v, "items") or isinstance(v, list))
        elif isinstance(node, list):
            stack.extend(v for v in node if hasattr(v, "items"))
    return None
