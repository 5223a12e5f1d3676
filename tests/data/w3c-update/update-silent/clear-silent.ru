CLEAR SILENT GRAPH <http://www.example.org>
