"""The one exception of the user commands."""


class UserError(Exception):
    """A problem the user can fix (bad file, no reply, unknown query): printed as one line, exit 1."""
