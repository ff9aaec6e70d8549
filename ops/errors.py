"""The one exception type the command line turns into a one-line error."""


class UserError(Exception):
    """Bad input or an unusable environment, explained in one line for the user."""
