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


class WriteError(Exception):
    """A file of a run could not be written (a full disk, a lost mount): one line and exit code 4 (`WRITE_EXIT_CODE`),
    and the run directory is kept, since what was saved before still resumes."""


WRITE_EXIT_CODE = 4  # 2 is bad input, 3 a lost process (processes.PEER_EXIT_CODE)
