"""What a command says on the terminal: bad input ends in one line naming the problem and the fix, and
exit code 2; Ctrl-C in one line and exit code 130; training and decoding print their progress.

`cli.run_script` (the `main()` of every script) prints a UsageError or a DataError as
`SCRIPT: error: MESSAGE`; OneLineParser makes argparse's own errors look the same. The progress lines
(below) are a bar on a terminal; elsewhere (nohup, tee, a cluster job, CI), where a bar prints nothing
until it ends, a line every so often with the rate, the time elapsed and the ETA:

    Progress(total_updates, start, every=50)    # training (callbacks.ProgressLog calls its update)
    DecodingProgress(sentences, "decoding")     # nmt_job.translate: test and validation BLEU

Without Keras until a bar is drawn (keras.utils.Progbar, on a terminal alone).
"""

import argparse
import contextlib
import signal
import sys
import threading
import time


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


WRITE_EXIT_CODE = 4  # 2 is bad input, 3 a lost process (files.PEER_EXIT_CODE)


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


# --- progress lines ------------------------------------------------------------------------------------

def duration(seconds):
    """"2m41s", or "1h02m" from an hour on."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class Progress:
    """Training progress. On a terminal, keras's progress bar. Otherwise (nohup, tee, a cluster job, CI),
    where a bar prints nothing until it ends, one line every `every` updates:

        progress: update 400/1077 (37%), loss 4.913, lr 1.00e-03, 2,480 tok/s, 2m41s elapsed, ETA 4m33s

    `start` is the update a resumed run starts from; speed and ETA count the updates of this process.
    """

    def __init__(self, total, start=0, every=50, stream=None):
        self.total, self.every = total, every
        self.stream = stream or sys.stdout
        self.started = None
        self.tokens = 0
        self.bar = None
        if self.stream.isatty():
            self.bar = _progbar(total, stateful_metrics=["loss", "lr"])
            self.bar.update(start)

    def update(self, updates, loss, lr, tokens=0):
        if self.started is None:  # the first update includes compilation: time from its end
            self.started, self.first = time.time(), updates
            return self.bar.update(updates, [("loss", loss), ("lr", lr)]) if self.bar else None
        self.tokens += tokens
        if self.bar:
            return self.bar.update(updates, [("loss", loss), ("lr", lr)])
        if not self.every or (updates % self.every and updates != self.total):
            return None
        elapsed = time.time() - self.started
        done = updates - self.first
        rate = f", {self.tokens / max(elapsed, 1e-9):,.0f} tok/s" if self.tokens else ""
        eta = duration(elapsed / done * (self.total - updates)) if done else "-"
        print(f"progress: update {updates}/{self.total} ({100 * updates // max(self.total, 1)}%), loss {loss:.3f}, "
              f"lr {lr:.2e}{rate}, {duration(elapsed)} elapsed, ETA {eta}", file=self.stream, flush=True)

    def pause(self):
        """Before other output (validation lines): end the bar's line on a terminal."""
        if self.bar:
            print(file=self.stream)


class DecodingProgress:
    """Progress of `translate`, on standard output as training's progress. On a terminal, keras's progress
    bar. Otherwise (a file, a pipe, a cluster job's log), a line when `every` seconds have passed since the
    last one, checked after each batch, and a final line:

        decoding: 1,500/6,250 sentences (24%), 41.3 sentences/s, 0m36s elapsed, ETA 1m55s

    rate = sentences done / time since the start (the first batches' compilation included), ETA = sentences
    left / rate. `translate` decodes the shortest sentences first, so while translations grow with their
    sources the ETA is low early on. A decoding shorter than `every` (a validation subset) prints the final
    line only.
    """

    def __init__(self, total, label="decoding", every=30.0):
        self.total, self.label, self.every, self.clock = total, label, every, time.monotonic
        self.started = self.last = self.clock()
        self.bar = None
        if sys.stdout.isatty():
            self.bar = _progbar(total, unit_name="sentence")

    def update(self, done):
        if self.bar:
            return self.bar.update(done)
        now = self.clock()
        if done < self.total and now - self.last < self.every:
            return None
        self.last, elapsed = now, now - self.started
        rate = done / max(elapsed, 1e-9)
        eta = f", ETA {duration((self.total - done) / rate)}" if done < self.total and rate > 0 else ""
        print(f"{self.label}: {done:,}/{self.total:,} sentences ({100 * done // max(self.total, 1)}%), "
              f"{rate:.1f} sentences/s, {duration(elapsed)} elapsed{eta}", flush=True)


def _progbar(*args, **kwargs):
    """keras.utils.Progbar, imported where a bar is drawn: the module stays without Keras for the command lines."""
    import keras

    return keras.utils.Progbar(*args, **kwargs)
