PREFIX     : <http://example.org/> 

DROP ALL

