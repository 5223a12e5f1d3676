PREFIX     : <http://example.org/> 

DROP DEFAULT

