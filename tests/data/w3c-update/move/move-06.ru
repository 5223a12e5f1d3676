PREFIX : <http://example.org/>
MOVE :g1 TO DEFAULT