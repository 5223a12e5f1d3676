# BNode in DELETE WHERE
DELETE WHERE { _:a <p> <o> }
