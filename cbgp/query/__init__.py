"""Reading a SPARQL query and decomposing its basic graph pattern into parts."""
