BASE <http://example/>
# Otherwise empty
