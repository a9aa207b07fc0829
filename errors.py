"""The project's error types: bad input ends in one line naming the problem and the fix, and exit code 2.

`cli.run_script` (the `main()` of every script) prints a UsageError or a DataError as
`SCRIPT: error: MESSAGE`; OneLineParser makes argparse's own errors look the same.
"""

import argparse


class UsageError(ValueError):
    """Bad command-line input or files: the scripts print it as one line and exit with code 2."""


class DataError(ValueError):
    """Bad input data: the message names the problem and the fix (scripts print it and exit 2)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one line (the problem, and --help for the fix) and exit code 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")
