PREFIX : <http://example.org/ns#>

INSERT DATA { :s :p :o }
