"""Multi-centre components evaluated across partitions: versioned state keyed by centre value and the
probes that join it."""
