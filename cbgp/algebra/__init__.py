"""Continuous SPARQL beyond basic graph patterns: incremental operators over the BGP engine.

`analyse(text)` -> a plain BGP `ParsedQuery` (the engine's fast path, unchanged) or an `OperatorQuerySpec`;
`ContinuousEngine` registers either and applies changes, returning exact `+`/`-` delta answers per change
(`-` rows first; a changed aggregate row is retracted and re-asserted in the same change).  No Kafka here.

Supported (rdflib parses; its algebra is compiled by `cbgp.algebra.compile`):
SELECT (projection, expressions, DISTINCT, REDUCED, subqueries), ASK (one empty row while true), CONSTRUCT
(rows subject/predicate/object, a set of triples; template blank nodes named after the solution); FILTER with
rdflib's SPARQL expression evaluator (where rdflib and SPARQL differ, SPARQL's: see `strict_comparisons`), FILTER
[NOT] EXISTS { group graph pattern } alone or in a conjunction; BIND; VALUES; OPTIONAL with its filter; UNION;
MINUS; GRAPH <iri> / GRAPH ?g; GROUP BY (variables or expressions) with COUNT [DISTINCT] (incl. *), SUM, AVG,
MIN, MAX, SAMPLE, GROUP_CONCAT [DISTINCT], HAVING; ORDER BY with LIMIT/OFFSET as a maintained window (ties
broken by the terms; ORDER BY alone changes no answer of a multiset); variables in predicate position
(`PatternLeaf`); property paths (`cbgp.algebra.paths`).  Rejected with the construct, line and column: an inverse
IRI inside a negated property set, SERVICE, FROM / FROM NAMED,
DESCRIBE, RAND/NOW/UUID/STRUUID/BNODE (their answers could not be retracted), EXISTS inside another expression,
aggregates inside EXISTS, and an EXISTS pattern that reads an outer variable where its own part does not bind it.
"""

from cbgp.algebra.pickling import register as register_pickling
from cbgp.algebra.compile import OperatorQuerySpec, analyse
from cbgp.algebra.continuous import ContinuousEngine, OperatorQuery

__all__ = ["ContinuousEngine", "OperatorQuery", "OperatorQuerySpec", "analyse"]

register_pickling()  # operator trees hold rdflib expression nodes, and checkpoints pickle them
