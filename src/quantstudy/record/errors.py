"""One exception type for user mistakes, kept apart from bugs.

The CLI prints a `UserError` as a clean one-line message and exits with code 1; any other
exception is a bug in quantstudy and keeps its traceback.
"""


class UserError(Exception):
    """A mistake the user can fix: bad path, bad recipe, unknown model, missing GPU."""
