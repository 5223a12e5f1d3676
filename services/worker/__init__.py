"""``cbgp worker``: routed changes and query plans in, query-part deltas out."""
