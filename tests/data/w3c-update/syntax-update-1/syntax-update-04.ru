LOAD <http://example.org/faraway> INTO GRAPH <localCopy>
