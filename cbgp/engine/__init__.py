"""The continuous BGP engine: registered queries, per-part state keyed by centre value, shared edge
tables and the assembly of multi-part answers."""
