"""Continuous SPARQL beyond basic graph patterns: incremental operators over the BGP engine.

`analyse(text)` -> a plain BGP `ParsedQuery` (the engine's fast path) or an
`OperatorQuerySpec`; `ContinuousEngine` registers either and applies changes,
returning exact `+`/`-` delta answers per change.  No Kafka here.
"""

from cbgp.algebra.compile import OperatorQuerySpec, analyse
from cbgp.algebra.runtime import ContinuousEngine, OperatorQuery

__all__ = ["ContinuousEngine", "OperatorQuery", "OperatorQuerySpec", "analyse"]
