# Comment
DELETE 
# Comment
WHERE 
# Comment
{ GRAPH <G> { <s> <p> 123 ; <q> 4567.0 . } }
