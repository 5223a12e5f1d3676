"""``cbgp answers``: query-part deltas in, numbered answers and current answers out."""
