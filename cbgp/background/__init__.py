"""Background data for SERVICE joins: local views refreshed within a budget (Dehghanzadeh et al.).

- :mod:`.view` -- the local view R (value, best-before time, change-interval estimate per join key);
- :mod:`.maintenance` -- proposers (WSJ, GNR), rankers (RND, LRU, WBM), oracles (WST, BST, WBM*), the budget
  gamma from rho (Eq. 2), the estimated accuracy and the alert below alpha (R4);
- :mod:`.remote` -- the SPARQL 1.1 Protocol client (SPARQLWrapper): bulk fill, one query per refresh;
- :mod:`.endpoint` -- a local endpoint the project starts (Virtuoso, or pyoxigraph where it is not installed).

Pure Python: no Kafka here (the algorithm layer, tests/test_layering.py).
"""

from cbgp.background.maintenance import (
    POLICIES,
    Alert,
    Election,
    Evaluation,
    Maintainer,
    Policy,
    Score,
    WindowShape,
    elect,
    estimated_accuracy,
    propose,
    refresh_budget,
    remaining_life,
    renewed_best_before,
    validity,
    wbm_scores,
)
from cbgp.background.view import ViewChange, Entry, LocalView, estimate_rate

__all__ = [
    "POLICIES", "Alert", "ViewChange", "Election", "Entry", "Evaluation", "LocalView", "Maintainer", "Policy", "Score",
    "WindowShape", "elect", "estimate_rate", "estimated_accuracy", "propose", "refresh_budget", "remaining_life",
    "renewed_best_before", "validity", "wbm_scores",
]
