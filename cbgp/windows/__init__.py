"""Event-time windows (RSP-QL style): their syntax, their specification and their exact evaluation."""
