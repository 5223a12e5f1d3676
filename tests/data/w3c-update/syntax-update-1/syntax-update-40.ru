PREFIX : <http://example/>
# Otherwise empty
