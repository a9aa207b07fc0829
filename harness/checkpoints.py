"""A run's checkpoints loaded: a model with its optimizer from a .keras file, the newest one that loads, and
where a resumed run goes on (`resume_point`). The Keras side of harness/rundir.py, which saves them.

    model = load_checkpoint("runs/pre/checkpoints/epoch3.keras", expect=TranslationTransformer)
    epoch, model, path = load_latest_checkpoint("runs/pre/checkpoints", upto=3)
    start = resume_point(run_dir, TranslationTransformer, batches_per_epoch)   # a `ResumePoint`
"""

import json
import os
import re
import sys
import zipfile
from dataclasses import dataclass, field

import keras
import numpy as np

import models  # noqa: F401  (registers the project's classes for deserialization, with the optimizer
import optimizers  # noqa: F401  (RAdam) and the learning-rate schedules of a saved optimizer's state)
import schedules  # noqa: F401
from harness.console import UsageError
from harness.files import RANDOM_STATE, seed_generators


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
