INSERT 
# Comment
DATA { GRAPH <G> { <s> <p> 'o1', 'o2', 'o3' } }
