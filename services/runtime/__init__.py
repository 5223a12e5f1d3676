"""What every service runs inside: the transactional loop, its life cycle, recovery and supervision."""
