"""One exception type for user mistakes, kept apart from bugs, and the exit statuses of both.

The CLI prints a `UserError` as a clean one-line message and exits with code 1; any other
exception is a bug in quantstudy: its traceback goes to a log file and the CLI exits with
`EXIT_INTERNAL` (`cli_crash.py`).
"""

EXIT_USER = 1
EXIT_INTERNAL = 5
EXIT_INTERRUPTED = 130
EXIT_NOTHING_SELECTED = 6  # a UserError of its own: the recipe selects no layer of the model
EXIT_PIPE = 141  # stdout's reader went away (`| head`): what a shell reports for SIGPIPE
# Every command's exit statuses beyond its own, for the epilogs of `quantstudy -h`.
EXIT_COMMON = (
    f"{EXIT_USER} user error, 2 usage error, {EXIT_INTERNAL} internal error (a bug; the "
    f"traceback is in the log file the last line names), {EXIT_INTERRUPTED} interrupted, "
    f"{EXIT_NOTHING_SELECTED} the recipe selects no layer of the model, {EXIT_PIPE} stdout "
    "closed by its reader"
)


class UserError(Exception):
    """A mistake the user can fix: bad path, bad recipe, unknown model, missing GPU."""

    exit_status = EXIT_USER


class NothingSelected(UserError):
    """The recipe selects no layer of the model: no FP8 engine to study. Its own exit status,
    so the zoo answers "no layer for FP8" instead of listing a failure (`zoo/answers.py`)."""

    exit_status = EXIT_NOTHING_SELECTED
