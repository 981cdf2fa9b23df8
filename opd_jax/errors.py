"""The one error type for bad user input.

Loading and validation functions (config checks, checkpoint / data / results readers, workdir checks) raise
`InputError` with a message that names the flag, field or file and says what to do. The launch scripts turn it,
and only it, into one `error: ...` line on stderr and exit code 2 (launch/_cli.py); any other exception is a
bug and keeps its traceback. It subclasses ValueError, so `except ValueError` callers keep working.
"""


class InputError(ValueError):
  """Bad user input; the message names the culprit and what to do."""


class TrainingStopped(RuntimeError):
  """A run that cannot go on (e.g. every update non-finite); launch/train.py exits 1 with one `error:` line."""
