"""The one exception that means "the user must fix something", not a bug."""


class UserError(Exception):
    """Bad input or environment; the job stops with this message as one line."""
