PREFIX     : <http://example.org/> 

CLEAR GRAPH :g1
