"""``cbgp ingest``: raw updates in, the total order of dictionary-encoded changes out."""
