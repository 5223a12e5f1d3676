"""The demo `make run` plays: an LSBench-shaped social network as RDF Patch, and example queries."""
