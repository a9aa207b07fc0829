"""Progress lines: a bar on a terminal; elsewhere (nohup, tee, a cluster job, CI), where a bar prints
nothing until it ends, a line every so often with the rate, the time elapsed and the ETA.

    Progress(total_updates, start, every=50)    # training (callbacks.ProgressLog calls its update)
    DecodingProgress(sentences, "decoding")     # decoding.translate: test and validation BLEU
"""

import sys
import time

import keras


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
            self.bar = keras.utils.Progbar(total, stateful_metrics=["loss", "lr"])
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
            self.bar = keras.utils.Progbar(total, unit_name="sentence")

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
