PREFIX     : <http://example.org/> 

DROP NAMED
