CREATE SILENT GRAPH <http://example.org/g1>
