"""The installed ``cbgp`` command: fleet, operations and user commands, and ``make run``."""
