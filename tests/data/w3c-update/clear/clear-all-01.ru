PREFIX     : <http://example.org/> 

CLEAR ALL

