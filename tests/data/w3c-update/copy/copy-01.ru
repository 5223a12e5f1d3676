PREFIX : <http://example.org/>
COPY DEFAULT TO :g1