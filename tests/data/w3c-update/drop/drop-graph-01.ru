PREFIX     : <http://example.org/> 

DROP GRAPH :g1
