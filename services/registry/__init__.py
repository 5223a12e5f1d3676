"""``cbgp registry``: admin commands in, query plans and status replies out."""
