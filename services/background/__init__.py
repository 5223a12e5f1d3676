"""``cbgp background``: SERVICE view graphs kept in step with their endpoints."""
