"""The project's error types: bad input ends in one line naming the problem and the fix, and exit code 2.

`cli.run_script` (the `main()` of every script) prints a UsageError or a DataError as
`SCRIPT: error: MESSAGE`; OneLineParser makes argparse's own errors look the same.
"""

import argparse
import contextlib
import signal
import sys
import threading


class UsageError(ValueError):
    """Bad command-line input or files: the scripts print it as one line and exit with code 2."""


class DataError(ValueError):
    """Bad input data: the message names the problem and the fix (scripts print it and exit 2)."""


def check_warmup(warmup, total, longer="--epochs / --max-updates"):
    """Refuse a warmup not shorter than training (`total` updates), naming the flags (`longer`) that lengthen
    it (`schedules.make_schedule` needs it shorter)."""
    if warmup and total is not None and warmup >= total:
        raise UsageError(f"--warmup-updates {warmup} is not shorter than training ({total} updates); "
                         f"lower --warmup-updates or raise {longer}")


# Flags of fairseq-train that a user of it would type, and how this project says the same (those it shares,
# --max-epoch, --max-update, --warmup-updates, --lr, --clip-norm, --weight-decay, --label-smoothing,
# --max-tokens, --seed, --save-dir, take fairseq's names as they are).
FAIRSEQ_FLAGS = {
    "--encoder-normalize-before": "--norm pre (Pre-LN in the encoder and the decoder)",
    "--decoder-normalize-before": "--norm pre (Pre-LN in the encoder and the decoder)",
    "--lr-scheduler": "--schedule (inverse_sqrt, constant, step, linear, decay_then_inverse_sqrt)",
    "--arch": "--preset iwslt (transformer_iwslt_de_en) or wmt14 (transformer_wmt_en_de)",
    "--criterion": "--label-smoothing (the loss is always label-smoothed cross-entropy)",
    "--warmup-init-lr": "none: warmup starts from 0, as fairseq's default",
    "--adam-betas": "none: Adam's betas are the paper's (0.9, 0.98)",
    "--restore-file": "--resume (with --out, the run folder)",
}


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one line (the problem, and --help for the fix) and exit code 2; an
    unrecognized fairseq-train flag names this project's way to say it (`FAIRSEQ_FLAGS`)."""

    def error(self, message):
        unknown = message.split("unrecognized arguments: ")[-1].split() if "unrecognized arguments: " in message else []
        hints = [f"fairseq's {flag} is {FAIRSEQ_FLAGS[flag.split('=')[0]]} here" for flag in unknown
                 if flag.split("=")[0] in FAIRSEQ_FLAGS]
        self.exit(2, f"{self.prog}: error: {message}{'; ' + '; '.join(hints) if hints else ''}; see {self.prog} --help\n")


class WriteError(Exception):
    """A file of a run could not be written (a full disk, a lost mount): one line and exit code 4 (`WRITE_EXIT_CODE`),
    and the run directory is kept, since what was saved before still resumes."""


WRITE_EXIT_CODE = 4  # 2 is bad input, 3 a lost process (processes.PEER_EXIT_CODE)


# --- Ctrl-C ------------------------------------------------------------------------------------------

INTERRUPT_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a process that Ctrl-C ended
INTERRUPT = dict(asked=False, training=0)  # a SIGINT came; fits under way (`interruptible`)


class Interrupted(Exception):
    """Ctrl-C during training: one line, exit code 130 (`INTERRUPT_EXIT_CODE`); the run's checkpoints are
    whole, and --resume goes on from the last."""


def on_interrupt(signum, frame):
    """The SIGINT handler of the scripts (`cli.run_script`): during training a flag that the update's end
    reads (`check_interrupt`), so that no save is cut short and no library swallows the interrupt (jax's
    garbage-collection callback does); else the KeyboardInterrupt of Python's own handler."""
    INTERRUPT["asked"] = True
    if not INTERRUPT["training"]:
        raise KeyboardInterrupt


def catch_interrupts():
    """Install `on_interrupt` for SIGINT (in the main thread: a signal's handler lives there) and clear the
    flag; returns what puts the handler before back."""
    INTERRUPT["asked"] = False
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGINT, on_interrupt)
    return lambda: signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


def interrupted(script, error, saved=True):
    """Print the one line of Ctrl-C (`error`: an `Interrupted`, or a KeyboardInterrupt outside training) and
    return its exit code. `saved`: whether a checkpoint of the run is there for --resume to go on from; if
    not, the line says that the command starts again."""
    line = str(error) or "interrupted; --resume goes on from the last checkpoint"
    if not saved:
        line = line.split(";")[0] + ", before the first checkpoint: nothing was saved; run the command again"
    print(f"{script}: {line}", file=sys.stderr, flush=True)
    return INTERRUPT_EXIT_CODE


def check_interrupt(updates):
    """After each update: end training, with one line, once Ctrl-C has been pressed."""
    if INTERRUPT["asked"]:
        raise Interrupted(f"interrupted at update {updates}; --resume goes on from the last checkpoint")


@contextlib.contextmanager
def interruptible(run):
    """Around `model.fit`: Ctrl-C sets the flag that `check_interrupt` reads (`on_interrupt`) instead of raising
    where it lands; one pressed during the last update ends the run as it leaves fit (`run`: its `updates`)."""
    INTERRUPT["training"] += 1
    try:
        yield
    finally:
        INTERRUPT["training"] -= 1
    check_interrupt(run.updates)
