"""Reading graph changes: RDF Patch, N-Triples, N-Quads, Turtle, JSON lines and SPARQL 1.1 Update."""
