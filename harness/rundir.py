"""A training run's directory, and the one owner of the files in it.

    runs/NAME/
      config.json      what ran: the flags, backend, versions and devices (`write_config`)
      state.json       where --resume goes on: the newest saved epoch (or step) and a mid-epoch backup
      metrics.csv      one row per validation (`rows`, `write_rows`)
      checkpoints/     epochN.keras (train_nmt.py), stepN.keras (pretrain_bert.py), backup.keras
                       (--backup-every): the model with its optimizer state
      results.json, curves.png, vocab/

    run_dir = RunDir("runs/pre", resume=args.resume, unit="epoch")  # created; holds a run iff --resume
    run_dir.write_config(args, extra, setup)
    point = run_dir.resume_point(expect=TranslationTransformer)     # the model and where it stands
    run_dir.save_epoch(model, epoch, updates)                       # epochN.keras, then state.json
    run_dir.save_backup(model, epoch, batch, updates, loss_state)   # backup.keras, then state.json
    run_dir.save_step(model, updates, loss_state, elapsed_s)        # stepN.keras, then state.json

Every file is written through a temporary file and a rename (`files.write_atomic`; checkpoints through
checkpoints/.partial-*), so a run stopped at any point leaves its newest complete files, and state.json
names only a checkpoint that is whole. A write that fails, a full disk for one, raises `errors.WriteError`:
one line naming the file, and what --resume will go on from once there is room (exit code 4).
"""

import json
import os
import platform
import re
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field

import keras

import models  # noqa: F401  (registers the project's classes for deserialization, with the optimizer
import optimizers  # noqa: F401  (RAdam) and the learning-rate schedules of a saved optimizer's state)
import schedules  # noqa: F401
from harness import devices
from harness.errors import UsageError, WriteError
from harness.files import STATE, holds_run, prepare_out_dir, read_csv, write_csv, write_json, writing
from harness.processes import is_chief
from harness.provenance import code_version


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


class RunDir:
    """The run directory `path` of one training run. `resume`: it must hold a run (a state.json), and
    without it must not; `unit`: "epoch" (checkpoints/epochN.keras, train_nmt.py) or "step"
    (checkpoints/stepN.keras, pretrain_bert.py)."""

    def __init__(self, path, resume, unit="epoch"):
        self.path, self.unit = prepare_out_dir(path), unit
        self.checkpoints = os.path.join(path, "checkpoints")
        what = "finished epoch" if unit == "epoch" else "checkpoint"
        if resume and not holds_run(path):
            raise UsageError(f"--resume: {path} has no {what} to resume from; run without --resume")
        if not resume and holds_run(path):
            raise UsageError(f"{path} already holds a run; pass --resume to continue it or choose another --out")

    def file(self, name):
        return os.path.join(self.path, name)

    # --- config.json, metrics.csv, results.json ---------------------------------------------------

    def write_config(self, args, extra=None, setup=None):
        self._guarded(write_json, self.file("config.json"), run_config(args, extra, setup))

    def config(self):
        with open(self.file("config.json")) as f:
            return json.load(f)

    def rows(self, upto=None, key="updates"):
        """metrics.csv's rows, those with `key` <= `upto` when given."""
        rows = read_csv(self.file("metrics.csv"))
        return rows if upto is None else [r for r in rows if int(r[key]) <= upto]

    def write_rows(self, rows):
        self._guarded(write_csv, self.file("metrics.csv"), rows)

    def write_results(self, result):
        """results.json: `result` and the `code_version` that produced it (`provenance`)."""
        self._guarded(write_json, self.file("results.json"), dict(result, code_version=code_version()))

    # --- checkpoints and state.json ---------------------------------------------------------------

    def save_epoch(self, model, epoch, updates):
        """checkpoints/epochN.keras, then state.json saying it is the newest finished epoch."""
        path = self._guarded(save_checkpoint, model, self.checkpoints, f"epoch{epoch}")
        self._guarded(write_json, self.file(STATE), dict(epoch=epoch, updates=updates, checkpoint=path))

    def save_backup(self, model, epoch, batch, updates, loss_state):
        """checkpoints/backup.keras within epoch `epoch` after `batch` of its batches; state.json keeps
        the newest finished epoch and adds the backup to resume from."""
        path = self._guarded(save_checkpoint, model, self.checkpoints, "backup")
        state = self._state() or dict(epoch=0, updates=0)
        self._guarded(write_json, self.file(STATE), dict(state, backup=dict(
            epoch=epoch, batch=batch, updates=updates, checkpoint=path, loss_state=loss_state)))

    def save_step(self, model, updates, loss_state, elapsed_s):
        """checkpoints/stepN.keras, then state.json naming it, with the loss tracker's state and the time."""
        path = self._guarded(save_checkpoint, model, self.checkpoints, f"step{updates}")
        self._guarded(write_json, self.file(STATE), dict(updates=updates, checkpoint=path, loss_state=loss_state,
                                                         elapsed_s=elapsed_s))

    def _guarded(self, write, *args):
        """`write(*args)`; a WriteError it raises gets what --resume would go on from added."""
        try:
            return write(*args)
        except WriteError as error:
            raise WriteError(f"{error}; {self._what_resumes()}") from None

    def _what_resumes(self):
        state = self._state()
        if not state:
            return "nothing of this run was saved yet: make room and run the command again"
        saved = (f"update {state['backup']['updates']}" if state.get("backup") else
                 f"epoch {state['epoch']}" if "epoch" in state else f"update {state['updates']}")
        return f"{self.path} is intact up to {saved}: make room and run the same command with --resume"

    def _state(self):
        """state.json's content, {} when there is none, None when it cannot be read."""
        if not holds_run(self.path):
            return {}
        try:
            with open(self.file(STATE)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def resume_point(self, expect, batches_per_epoch=None):
        """The model to go on with and where it stands, from state.json and the newest checkpoint that
        loads (falling back past corrupt ones, with a warning), after removing leftovers of interrupted
        saves; `expect` is the model class a checkpoint must hold. Prints where the run goes on."""
        remove_partial_saves(self.checkpoints)
        state = self._state()
        if self.unit == "step":
            return self._resume_step(state, expect)
        return self._resume_epoch(state, expect, batches_per_epoch)

    def _resume_step(self, state, expect):
        updates, model, path = load_latest_checkpoint(self.checkpoints, upto=state["updates"], prefix="step",
                                                      expect=expect)
        whole = updates == state["updates"]  # else an older checkpoint, after a corrupt one: redo from there
        print(f"resuming {self.path} at update {updates}")
        return ResumePoint(model, path, updates, self.rows(upto=updates), loss_state=state.get("loss_state") if whole
                           else None, elapsed_s=state["elapsed_s"] if whole else 0.0)

    def _resume_epoch(self, state, expect, batches_per_epoch):
        try:  # written atomically, so only an outside hand can break it; then the checkpoints alone decide
            last = int(state["epoch"])
        except (TypeError, ValueError, KeyError) as error:
            print(f"warning: {self.file(STATE)} cannot be read ({type(error).__name__}); resuming from the newest "
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
                print(f"resuming {self.path} in epoch {last + 1} after update {updates} (batch {skip} of "
                      f"{batches_per_epoch}) from {backup['checkpoint']}")
                return ResumePoint(model, backup["checkpoint"], updates, self.rows(upto=updates), epoch=last + 1,
                                   skip=skip, loss_state=backup["loss_state"])
        # The newest epoch checkpoint that loads; rows after it (a killed epoch's, or ones redone after a
        # corrupt checkpoint) are dropped.
        epoch, model, path = load_latest_checkpoint(self.checkpoints, upto=last, expect=expect)
        rows = self.rows(upto=epoch, key="epoch")
        counts = [int(r["updates"]) for r in rows if int(r["epoch"]) == epoch]
        updates = (int(state["updates"]) if epoch == last and "updates" in state else counts[-1] if counts
                   else int(keras.ops.convert_to_numpy(model.optimizer.iterations)))
        print(f"resuming {self.path} after epoch {epoch} ({updates} updates) from {path}")
        return ResumePoint(model, path, updates, rows, epoch=epoch + 1)

def remove_partial_saves(directory):
    """Remove the leftovers of interrupted checkpoint saves (".partial-*") in `directory` (the chief alone)."""
    if not is_chief() or not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if name.startswith(".partial-"):
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass


# --- config.json ---------------------------------------------------------------------------------

def run_config(args, extra=None, setup=None):
    """What config.json records: the arguments, the backend, the versions, the process settings, and
    the devices of `setup` (a `devices.Setup`: processes, devices, replicas, distribute_mode)."""
    versions = {"python": platform.python_version(), "keras": keras.__version__}
    for name in ("jax", "tensorflow", "torch", "numpy", "sacrebleu"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    config.update(backend=keras.backend.backend(), versions=versions, command=" ".join(sys.argv),
                  runtime=dict(devices.RUNTIME), **(setup.config() if setup else {}))
    config.update(extra or {})
    return config


# --- checkpoints ---------------------------------------------------------------------------------

def save_checkpoint(model, directory, name):
    """Save model and optimizer state to directory/name.keras atomically; returns the path.

    Several processes: the chief alone writes it. The others save into a temporary directory that is
    then removed: Keras's saving creates a variable, which under a jax distribution or a tf.distribute
    strategy is a step that every process must take (jax checks that the processes agree on its value).
    """
    path = os.path.join(directory, f"{name}.keras")
    if not is_chief():
        with tempfile.TemporaryDirectory() as scratch:
            model.save(os.path.join(scratch, f"{name}.keras"))
        return path
    tmp = os.path.join(directory, f".partial-{os.getpid()}-{name}.keras")  # Keras wants the .keras suffix
    with writing(path, tmp):
        os.makedirs(directory, exist_ok=True)
        model.save(tmp)
        os.replace(tmp, path)
    return path


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


def _load_checkpoint(path, expect=None):
    if os.path.isdir(path):
        raise _CheckpointError("is a directory; pass a .keras file such as runs/NAME/checkpoints/epoch1.keras")
    if not os.path.isfile(path):
        raise _CheckpointError("file not found; pass a .keras file that a run wrote (runs/NAME/checkpoints/)")
    if path.endswith(".keras") and not zipfile.is_zipfile(path):  # Keras would call it "File not found"
        raise _CheckpointError("cannot be loaded (not a zip archive: truncated, or not a .keras file); it is corrupt: "
                               "remove it or start a new --out")
    try:
        model = keras.models.load_model(path)
    except Exception as error:  # zip, json or weight-shape errors from inside Keras
        raise _CheckpointError(f"cannot be loaded ({type(error).__name__}: "
                               f"{str(error).splitlines()[0][:200] if str(error) else ''}); it is corrupt or from "
                               "another architecture: remove it or start a new --out") from None
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
