PREFIX     : <http://example.org/> 

INSERT {
	?s ?p "q"
} WHERE {
	?s ?p ?o
}
