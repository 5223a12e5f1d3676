DROP SILENT GRAPH <http://www.example.org>
