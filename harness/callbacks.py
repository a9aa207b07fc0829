"""What `model.fit` needs from train_nmt.py and pretrain_bert.py: the batches as `keras.utils.PyDataset`s
and the callbacks that validate, log, checkpoint and stop; and resuming from what they saved (the section at
the end).

    model.fit(EpochBatches(...), initial_epoch=E - 1, epochs=args.epochs,
              callbacks=[Counter, Divergence, ProgressLog, Validation, EpochCheckpoint, StepBackup])

The callbacks share one `Run` (updates so far, the metrics rows, the outcome) and are called in that
order after each update: count it, stop on a non-finite loss, print progress, validate when due, save.

The training loss. Keras's `logs["loss"]` is its loss tracker: the mean of the batch losses, each
weighted by its rows (sentences or sequences), since the tracker was last reset. `Validation` resets
it after each metrics row, so a row's `train_loss` is the row-weighted mean training loss since the
previous row (fit resets it at each epoch start too, where a row has just been written). A non-finite
batch loss makes the mean non-finite at once, so `Divergence` sees it at the update it happens.

Resuming is not a callback: the model, with its compiled optimizer and learning-rate schedule, is the
one loaded from the newest checkpoint that loads (`rundir.RunDir.resume_point` falls back past corrupt
ones before any model exists), and `fit` starts from that model. What a callback does restore
is the loss tracker of an interrupted window (`Counter`, at the first epoch's start, after fit has
reset it), so that the resumed run's rows equal an uninterrupted run's bit for bit.
"""

import json
import os
import re
import sys
import time
import zipfile
from dataclasses import dataclass, field

import keras
import numpy as np

import models  # noqa: F401  (registers the project's classes for deserialization, with the optimizer
import optimizers  # noqa: F401  (RAdam) and the learning-rate schedules of a saved optimizer's state)
import schedules  # noqa: F401
from harness.console import UsageError, check_interrupt, interruptible
from harness.devices import seed_dropout, tf_split
from harness.files import RANDOM_STATE, is_finite, process_count, seed_generators


class Run:
    """What the callbacks share: `updates` done, `rows` of metrics.csv, `outcome` ("finished",
    "stopped" or "diverged"), `epoch` running (1-based) and `batch`es done in it, `stop` (stop fit after
    that many updates; None: no bound), `tokens` since the last row, `started` (time.time() at the
    start of training), `loss_state`
    (total, count) to give the loss tracker at the start of training, or None, and `seed`, the run's --seed."""

    def __init__(self, updates=0, rows=(), outcome="finished", stop=None, loss_state=None, seed=0):
        self.updates, self.rows, self.outcome, self.stop, self.seed = updates, list(rows), outcome, stop, seed
        self.epoch, self.batch, self.tokens, self.window_started, self.loss_state = 0, 0, 0, time.time(), loss_state
        self.started = time.time()  # a resumed run moves it back by the time trained before
        self.plateau_at = None  # the update at which early stopping (`Plateau`) ended training


def loss_tracker(model):
    """Keras's loss tracker of a compiled model: the `keras.metrics.Mean` named "loss" among `model.metrics`,
    whose result is fit's `logs["loss"]`."""
    return next(metric for metric in model.metrics if metric.name == "loss")


def loss_tracker_state(model):
    """(total, count) of Keras's loss tracker (`logs["loss"]` is total / count), as floats."""
    tracker = loss_tracker(model)
    return [float(keras.ops.convert_to_numpy(v)) for v in (tracker.total, tracker.count)]


class _Callback(keras.callbacks.Callback):
    """A callback that can stop fit without touching the model's state: on jax, `self.model` copies the
    trained state back into the variables at each access (right before validating or saving, wasted
    after every update), so `self.trained` keeps the plain reference that `set_model` receives."""

    def set_model(self, model):
        super().set_model(model)
        self.trained = model

    def stop(self):
        self.trained.stop_training = True


class DropoutSeed(keras.callbacks.Callback):
    """Before each update, `devices.seed_dropout(run.seed, run.updates)`: on torch the dropout masks of an
    update depend on the run's seed and the update alone, so a resumed run draws an uninterrupted one's
    (jax and tensorflow: nothing to do; a checkpoint carries their generators). `fit` adds it."""

    def __init__(self, run):
        super().__init__()
        self.run = run

    def on_train_batch_begin(self, batch, logs=None):
        seed_dropout(self.run.seed, self.run.updates)


# --- data ------------------------------------------------------------------------------------------

class EpochBatches(keras.utils.PyDataset):
    """The batches of training epoch `epoch` (1-based), in a fixed order: `make(epoch)` returns them
    (e.g. `nmt_data.make_batches` seeded from the epoch), each passed through `pad` for the devices.

    `skip` leaves out the first batches of the epoch, which a resumed run has already trained: fit
    runs `len(self)` updates in an epoch, so a dataset with `skip` serves the one, shorter, epoch that
    finishes an interrupted one. `Counter` sets `epoch` at each epoch's start. `tokens(index)` is the
    number of target tokens (labels other than `pad_id`) of the batch fit saw as `index`.
    """

    def __init__(self, make, count, epoch, skip=0, pad=lambda batch: batch, pad_id=0):
        super().__init__()  # one worker, in this thread: batches are made in order, as the seed says
        self.make, self.count, self.epoch, self.skip, self.pad, self.pad_id = make, count, epoch, skip, pad, pad_id
        self._made = (None, None)

    def __len__(self):
        return self.count - self.skip

    def batches(self):
        if self._made[0] != self.epoch:
            self._made = (self.epoch, self.make(self.epoch))
        return self._made[1]

    def __getitem__(self, index):
        return self.pad(self.batches()[index + self.skip])

    def tokens(self, index):
        return int((self.batches()[index + self.skip][1] != self.pad_id).sum())


class StepBatches(keras.utils.PyDataset):
    """The batches of updates start+1 ... stop, batch i being `make(i)` (a function of the update
    alone, as `bert_job.training_batch`), each passed through `pad`; `count_tokens(batch)` for the
    progress line."""

    def __init__(self, make, start, stop, pad=lambda batch: batch, count_tokens=lambda batch: 0):
        super().__init__()
        self.make, self.start, self.stop, self.pad, self.count_tokens = make, start, stop, pad, count_tokens
        self._made = (None, None)

    def __len__(self):
        return self.stop - self.start

    def batch(self, index):
        if self._made[0] != index:
            self._made = (index, self.make(self.start + index))
        return self._made[1]

    def __getitem__(self, index):
        return self.pad(self.batch(index))

    def tokens(self, index):
        return self.count_tokens(self.batch(index))


# --- callbacks -------------------------------------------------------------------------------------

class Counter(_Callback):
    """Counts updates and tokens into `run`, tells `dataset` which epoch runs, gives the loss tracker
    a resumed window's state, ends training after an update in which Ctrl-C was pressed (`console.Interrupted`),
    and stops fit at `run.stop` updates (--max-updates)."""

    def __init__(self, run, dataset):
        super().__init__()
        self.run, self.dataset = run, dataset

    def on_epoch_begin(self, epoch, logs=None):
        self.run.epoch = epoch + 1  # fit counts epochs from 0
        self.run.batch = getattr(self.dataset, "skip", 0)
        if isinstance(self.dataset, EpochBatches):
            self.dataset.epoch = self.run.epoch
        if self.run.loss_state is not None:  # fit has just reset the tracker; a resumed window goes on
            tracker = loss_tracker(self.model)
            tracker.total.assign(self.run.loss_state[0])
            tracker.count.assign(self.run.loss_state[1])
            self.run.loss_state = None

    def on_train_batch_end(self, batch, logs=None):
        self.run.updates += 1
        self.run.batch += 1
        self.run.tokens += self.dataset.tokens(batch)
        check_interrupt(self.run.updates)  # Ctrl-C: one line, and --resume goes on
        if self.run.stop and self.run.updates >= self.run.stop:
            self.stop()


class Divergence(_Callback):
    """A non-finite training loss ends the run as a result, not a crash: `record(loss)` writes the
    "diverged" row and says so; fit stops after this update, and nothing after it is saved."""

    def __init__(self, run, record):
        super().__init__()
        self.run, self.record = run, record

    def on_train_batch_end(self, batch, logs=None):
        if not is_finite(logs["loss"]):
            self.run.outcome = "diverged"
            self.record(float(logs["loss"]))
            self.stop()


class ProgressLog(keras.callbacks.Callback):
    """`console.Progress` after each update: a bar on a terminal, otherwise a line every N updates
    (loss as fit's running mean since the last row, the learning rate of the update, tokens/s, ETA)."""

    def __init__(self, run, progress, learning_rate, dataset):
        super().__init__()
        self.run, self.progress, self.learning_rate, self.dataset = run, progress, learning_rate, dataset

    def on_train_batch_end(self, batch, logs=None):
        if self.run.outcome != "diverged":
            self.progress.update(self.run.updates, float(logs["loss"]), self.learning_rate(self.run.updates - 1),
                                 self.dataset.tokens(batch))


class Validation(keras.callbacks.Callback):
    """A metrics row when `due(updates, updates of the last row)` says so after an update, and at the
    end of each epoch (of fit's one epoch for pretrain_bert.py): `validate(model, train_loss,
    tokens_per_s)` evaluates, appends the row to `run.rows` and writes metrics.csv. The loss tracker
    is reset after each row, so that `logs["loss"]` is the mean since the previous row."""

    def __init__(self, run, validate, due, progress=None):
        super().__init__()
        self.run, self.validate, self.due, self.progress = run, validate, due, progress

    def _last(self):
        return int(self.run.rows[-1]["updates"]) if self.run.rows else None

    def _row(self, logs):
        if self.progress:
            self.progress.pause()
        seconds = time.time() - self.run.window_started
        model = self.model  # on jax: the trained state copied back into the variables
        self.validate(model, float(logs["loss"]), round(self.run.tokens / max(seconds, 1e-9), 1))
        model.reset_metrics()
        self.run.tokens, self.run.window_started = 0, time.time()

    def on_train_batch_end(self, batch, logs=None):
        if self.run.outcome != "diverged" and self.due(self.run.updates, self._last() or 0):
            self._row(logs)

    def on_epoch_end(self, epoch, logs=None):
        if self.run.outcome != "diverged" and self._last() != self.run.updates:
            self._row(logs)


def plateaued(losses, patience, min_delta):
    """Whether the last `patience` validation losses all failed to lower the best one before them by
    `min_delta`: min(last patience) > min(the rest) - min_delta."""
    if patience < 1 or len(losses) <= patience:
        return False
    return min(losses[-patience:]) > min(losses[:-patience]) - min_delta


class Plateau(_Callback):
    """Early stopping on the validation loss, the converged protocol's (results/protocols.md, 2026-11-29, 9):
    after each metrics row, fit stops once `patience` validations in a row have not lowered the best
    validation loss by `min_delta` (`plateaued`): the run has trained to its plateau, and ends as one that
    reached its last update (test decoding, results.json with `plateau_at`, the update it stopped at).
    A schedule with a step still to make has not reached its plateau: no validation at or before update
    `after` (the schedule's step; 0: none) stops the run (results/protocols.md, 2026-12-06)."""

    def __init__(self, run, patience, min_delta, after=0):
        super().__init__()
        self.run, self.patience, self.min_delta, self.after = run, patience, min_delta, after

    def _check(self):
        rows = [r for r in self.run.rows if is_finite(r["valid_loss"])]
        losses = [float(r["valid_loss"]) for r in rows]
        if self.run.outcome != "diverged" and rows and int(rows[-1]["updates"]) > self.after \
                and plateaued(losses, self.patience, self.min_delta):
            self.run.plateau_at = self.run.updates
            self.stop()

    def on_train_batch_end(self, batch, logs=None):
        self._check()

    def on_epoch_end(self, epoch, logs=None):
        self._check()


class EpochCheckpoint(keras.callbacks.Callback):
    """checkpoints/epochN.keras (model and optimizer) at the end of each epoch, then state.json saying
    it is the newest finished epoch (`RunDir.save_epoch`); nothing after a divergence."""

    def __init__(self, run, run_dir):
        super().__init__()
        self.run, self.run_dir = run, run_dir

    def on_epoch_end(self, epoch, logs=None):
        if self.run.outcome != "diverged":
            self.run_dir.save_epoch(self.model, self.run.epoch, self.run.updates)


class StepBackup(keras.callbacks.Callback):
    """A checkpoint after each update for which `due(run)` holds: `save(model, run, loss_state)`, e.g.
    `RunDir.save_backup` (train_nmt.py's --backup-every, within an epoch) or `RunDir.save_step`
    (pretrain_bert.py's --save-every), with the loss tracker's (total, count), so that a resumed run
    finishes the interrupted metrics window exactly. Nothing after a divergence.

    Like Keras's BackupAndRestore, but a backup also records the update and the batch within the epoch,
    and restoring happens before fit (see this module's docstring); the files are kept when training ends.
    """

    def __init__(self, run, due, save):
        super().__init__()
        self.run, self.due, self.save = run, due, save

    def on_train_batch_end(self, batch, logs=None):
        if self.run.outcome != "diverged" and self.due(self.run):
            model = self.model  # on jax: the trained state copied back into the variables
            self.save(model, self.run, loss_tracker_state(model))


def fit_input(dataset):
    """What `model.fit` is given for `dataset`: the PyDataset itself, or on tensorflow a tf.data.Dataset
    reading it in order, with every dimension unknown. (Keras would build a tf.data signature from the
    dataset's first two batches, and reject a later batch of another shape when those two share one.)"""
    if keras.backend.backend() != "tensorflow":
        return dataset
    import tensorflow as tf

    signature = keras.tree.map_structure(lambda a: tf.TensorSpec([None] * a.ndim, a.dtype), dataset[0])

    def batches():  # called at the start of each epoch, when `Counter` has set the dataset's epoch
        for index in range(len(dataset)):
            yield dataset[index]

    return tf.data.Dataset.from_generator(batches, output_signature=signature).apply(
        tf.data.experimental.assert_cardinality(len(dataset)))


def fit(model, dataset, run, callbacks, epochs, initial_epoch=0):
    """model.fit without Keras's own progress bar (`ProgressLog` prints progress) and without shuffling
    (the dataset's order is the run's); with several tensorflow workers, `_fit_tf_workers` instead.
    `DropoutSeed` comes first among the callbacks."""
    if initial_epoch >= epochs or (run.stop and run.updates >= run.stop) or not len(dataset):
        return
    callbacks = [DropoutSeed(run), *callbacks]
    with interruptible(run):  # Ctrl-C ends training after the update under way (`Counter`)
        if keras.backend.backend() == "tensorflow" and process_count() > 1:
            return _fit_tf_workers(model, dataset, callbacks, epochs, initial_epoch)
        model.fit(fit_input(dataset), epochs=epochs, initial_epoch=initial_epoch, callbacks=callbacks, verbose=0,
                  shuffle=False)


def _fit_tf_workers(model, dataset, callbacks, epochs, initial_epoch):
    """`model.fit` for several tensorflow workers (MultiWorkerMirroredStrategy): Keras 3.15's fit over a
    distributed dataset of dict inputs fails in its symbolic build, so this loop runs the callbacks as
    fit does and Keras's own train step (`model.train_function`, which unlike `train_on_batch` keeps the
    loss tracker's running mean) on each replica's slice of every global batch (`devices.Setup.shard`
    splits it the same way), with the sample weights of `replica_token_weights`."""
    import tensorflow as tf

    strategy = tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    model.make_train_function()
    callbacks = keras.callbacks.CallbackList(callbacks, model=model)
    model.stop_training, logs = False, {}
    callbacks.on_train_begin()
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callbacks.on_epoch_begin(epoch)
        for index in range(len(dataset)):
            callbacks.on_train_batch_begin(index)
            inputs, labels = dataset[index]
            batch = (inputs, labels, replica_token_weights(model.loss, labels, replicas))
            logs = model.train_function(iter([tf_split(strategy, batch, replicas)]))
            logs = {name: float(keras.ops.convert_to_numpy(value)) for name, value in logs.items()}
            callbacks.on_train_batch_end(index, logs)
            if model.stop_training:
                break
        callbacks.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    callbacks.on_train_end(logs)


def replica_token_weights(loss, labels, replicas):
    """Sample weights (one per row, repeated over its tokens) that make tf.distribute's replicas train
    on the global token mean.

    Each replica's token loss (models.LabelSmoothedCrossEntropy: the mean over its own non-padding
    tokens) is averaged over the replicas by Keras, which equals the mean over all tokens only when
    every replica holds as many. Replica r of R, holding n_r of the N tokens, gets the weight R n_r / N:
    then (1/R) sum_r R n_r / N * (sum of r's token losses / n_r) = (sum of all token losses) / N, the loss
    one device computes on the whole batch. A loss without a `pad_id` (NSP, per row) gets weight 1, as the
    replicas hold equal row counts. `loss` is the compiled loss (a dict by output, or one loss).
    """
    def weights(loss, y):
        rows = len(y) // replicas
        if getattr(loss, "pad_id", None) is None or y.ndim < 2:
            return np.ones(len(y), "float32")
        tokens = (y != loss.pad_id).reshape(replicas, rows, -1).sum(axis=(1, 2)).astype("float64")
        per_row = np.repeat(replicas * tokens / max(tokens.sum(), 1.0), rows).astype("float32")
        return np.ascontiguousarray(np.broadcast_to(per_row.reshape((-1,) + (1,) * (y.ndim - 1)), y.shape))

    if isinstance(labels, dict):
        return {name: weights(loss[name], y) for name, y in labels.items()}
    return weights(loss, labels)


# --- resuming: the newest checkpoint that loads, and where the run goes on ----------------------------------
# A run's checkpoints loaded: a model with its optimizer from a .keras file, the newest one that loads, and
# where a resumed run goes on (`resume_point`): the Keras side of harness/rundir.py, which saves them.
#
#     model = load_checkpoint("runs/pre/checkpoints/epoch3.keras", expect=TranslationTransformer)
#     epoch, model, path = load_latest_checkpoint("runs/pre/checkpoints", upto=3)
#     start = resume_point(run_dir, TranslationTransformer, batches_per_epoch)   # a `ResumePoint`

@dataclass
class ResumePoint:
    """Where a resumed run goes on: `model` (with its compiled optimizer and schedule) loaded from
    `checkpoint` after `updates` updates; `rows` of metrics.csv up to then; for epochs, `epoch` is the
    epoch training goes on in and `skip` its batches already trained (a --backup-every backup), for
    steps, `elapsed_s` the training time so far; `loss_state` the loss tracker's (total, count) of an
    interrupted metrics window, or None."""

    model: object
    checkpoint: str
    updates: int
    rows: list = field(default_factory=list)
    epoch: int = 1
    skip: int = 0
    loss_state: list = None
    elapsed_s: float = 0.0


def resume_point(run_dir, expect, batches_per_epoch=None):
    """The model to go on with and where it stands, from state.json and the newest checkpoint that
    loads (falling back past corrupt ones, with a warning), after removing leftovers of interrupted
    saves; `expect` is the model class a checkpoint must hold. Prints where the run goes on. What draws
    the dropout masks is set as it was at the save (call it after `keras.utils.set_random_seed`), so the
    run goes on as an uninterrupted one would."""
    run_dir.remove_partial_saves()
    state = run_dir.state()
    if run_dir.unit == "step":
        point = _resume_step(run_dir, state, expect)
    else:
        point = _resume_epoch(run_dir, state, expect, batches_per_epoch)
    _restore_random_state(point.model, point.checkpoint)
    return point


def set_random_state(model, state):
    """Set what draws `model`'s dropout masks to `state` (`rundir.random_state`'s); False when it does not fit
    the model (another number of generators), with nothing changed."""
    variables = seed_generators(model)
    if len(state.get("seed_generators", ())) != len(variables):
        return False
    for variable, value in zip(variables, state["seed_generators"]):
        variable.assign(np.asarray(value, dtype=variable.dtype))
    return True


def _restore_random_state(model, path):
    """The dropout masks' random state saved in checkpoint `path`, set in `model`. A checkpoint saved without
    one (or, by an outside hand, with one that does not fit) starts the generators again, with a warning."""
    with zipfile.ZipFile(path) as archive:
        try:
            state = json.loads(archive.read(RANDOM_STATE))
        except (KeyError, ValueError):
            state = None
    if state is None or not set_random_state(model, state):
        print(f"warning: {path} holds no usable random state (saved by an older version); the dropout masks "
              "start again, so the run goes on differently from an uninterrupted one", file=sys.stderr)

def _resume_step(run_dir, state, expect):
    updates, model, path = load_latest_checkpoint(run_dir.checkpoints, upto=state["updates"], prefix="step",
                                                  expect=expect)
    whole = updates == state["updates"]  # else an older checkpoint, after a corrupt one: redo from there
    print(f"resuming {run_dir.path} at update {updates}")
    return ResumePoint(model, path, updates, run_dir.rows(upto=updates), loss_state=state.get("loss_state") if whole
                       else None, elapsed_s=state["elapsed_s"] if whole else 0.0)

def _resume_epoch(run_dir, state, expect, batches_per_epoch):
    try:  # written atomically, so only an outside hand can break it; then the checkpoints alone decide
        last = int(state["epoch"])
    except (TypeError, ValueError, KeyError) as error:
        print(f"warning: {run_dir.state_file} cannot be read ({type(error).__name__}); resuming from the newest "
              "checkpoint that loads", file=sys.stderr)
        state, last = {}, None
    backup = state.get("backup") if last is not None else None
    if backup and int(backup["epoch"]) == last + 1:  # a --backup-every backup within the next epoch
        try:
            model = load_checkpoint(backup["checkpoint"], expect=expect)
        except UsageError as error:
            print(f"warning: {error}; resuming from the newest epoch checkpoint instead", file=sys.stderr)
        else:
            updates, skip = int(backup["updates"]), int(backup["batch"])
            print(f"resuming {run_dir.path} in epoch {last + 1} after update {updates} (batch {skip} of "
                  f"{batches_per_epoch}) from {backup['checkpoint']}")
            return ResumePoint(model, backup["checkpoint"], updates, run_dir.rows(upto=updates), epoch=last + 1,
                               skip=skip, loss_state=backup["loss_state"])
    # The newest epoch checkpoint that loads; rows after it (a killed epoch's, or ones redone after a
    # corrupt checkpoint) are dropped.
    epoch, model, path = load_latest_checkpoint(run_dir.checkpoints, upto=last, expect=expect)
    rows = run_dir.rows(upto=epoch, key="epoch")
    counts = [int(r["updates"]) for r in rows if int(r["epoch"]) == epoch]
    updates = (int(state["updates"]) if epoch == last and "updates" in state else counts[-1] if counts
               else int(keras.ops.convert_to_numpy(model.optimizer.iterations)))
    print(f"resuming {run_dir.path} after epoch {epoch} ({updates} updates) from {path}")
    return ResumePoint(model, path, updates, rows, epoch=epoch + 1)


def load_checkpoint(path, expect=None):
    """Load a .keras checkpoint (model with its optimizer), or raise UsageError naming the problem.

    expect: a model class (or a tuple of them) the checkpoint must hold, e.g. TranslationTransformer;
    None accepts any model.
    """
    try:
        return _load_checkpoint(path, expect)
    except _CheckpointError as error:
        raise UsageError(f"checkpoint {path}: {error}") from None


class _CheckpointError(Exception):
    """Why one checkpoint file cannot be used (a short reason, without advice)."""


_ANOTHER_CHECKPOINT = "pass a .keras file that a run of this project wrote (runs/NAME/checkpoints/)"


def _first_words(text, limit=160):
    """The first line of a library's message, cut at a word boundary when longer than `limit`."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    if len(line) <= limit:
        return line
    return line[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."


def _load_checkpoint(path, expect=None):
    if os.path.isdir(path):
        raise _CheckpointError("is a directory; pass a .keras file such as runs/NAME/checkpoints/epoch1.keras")
    if not os.path.isfile(path):
        raise _CheckpointError("file not found; pass a .keras file that a run wrote (runs/NAME/checkpoints/)")
    if not path.endswith(".keras"):
        raise _CheckpointError(f"is not a .keras file; {_ANOTHER_CHECKPOINT}")
    if not zipfile.is_zipfile(path):  # Keras would call it "File not found"
        raise _CheckpointError("cannot be loaded (not a zip archive: truncated, or not a .keras file); "
                               f"{_ANOTHER_CHECKPOINT}")
    try:
        model = keras.models.load_model(path)
    except Exception as error:  # zip, json or weight-shape errors from inside Keras
        raise _CheckpointError(f"cannot be loaded ({type(error).__name__}: {_first_words(str(error))}); it is "
                               f"corrupt or not a checkpoint of this project: {_ANOTHER_CHECKPOINT}") from None
    if expect is not None and not isinstance(model, expect):
        names = " or ".join(c.__name__ for c in (expect if isinstance(expect, tuple) else (expect,)))
        raise _CheckpointError(f"holds a {type(model).__name__}, not a {names}; pass a checkpoint of this "
                               "script's model")
    return model


def load_latest_checkpoint(directory, upto=None, prefix="epoch", expect=None, report=None):
    """The newest checkpoint of a run that loads, falling back past corrupt ones.

    directory: the run's checkpoint folder, holding `{prefix}N.keras` files (N = 1, 2, ...).
    upto: ignore files with N > upto (the last one that state.json records); None: no bound.
    prefix: the file-name stem before N ("epoch" or "step").
    expect: the model class (or tuple of classes) a checkpoint must hold, as in `load_checkpoint`.
    report: called with one warning line when newer checkpoints had to be skipped (default: print
        to stderr).

    Returns (N, model, path) for the largest N whose file loads. Raises UsageError, naming every file
    tried and why it failed, when none loads.
    """
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)\.keras$")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    found = sorted(((int(m.group(1)), name) for name in names if (m := pattern.match(name))), reverse=True)
    skipped = []
    for number, name in found:
        if upto is not None and number > upto:
            continue
        path = os.path.join(directory, name)
        try:
            model = _load_checkpoint(path, expect)
        except _CheckpointError as error:
            skipped.append(f"{path} {str(error).split('; ')[0]}")
            continue
        if skipped:
            (report or (lambda line: print(line, file=sys.stderr)))(
                f"warning: checkpoint {', '.join(skipped)}: it is corrupt or unusable; resuming from "
                f"{prefix} {number} ({path}) instead, the later {prefix}s are redone")
        return number, model, path
    tried = "; ".join(skipped) or f"no {prefix}N.keras file there"
    raise UsageError(f"{directory}: no checkpoint can be loaded ({tried}); the run cannot be resumed: "
                     "start it again with a new --out")
