# BNode in DELETE DATA
DELETE DATA { _:a <p> <o> }
