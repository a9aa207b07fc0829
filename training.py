"""What the scripts share: run directories, atomic files, checkpoints, and the backend-specific helpers.

The backend-specific code of the project lives here, in two small marked functions:
`loss_and_gradients` (each backend's own autodiff) and `compiled` (jax.jit / tf.function / eager torch).
Everything else is backend-free.
"""

import csv
import importlib.util
import io
import json
import math
import os
import platform
import shutil
import sys
import time

import numpy as np

import distribution
from errors import DataError, UsageError


def quiet_tensorflow():
    """Import TensorFlow, when it is installed, with its C++ start-up lines kept off the terminal.

    Keras imports TensorFlow under every backend where it is installed (`keras.utils.set_random_seed`
    does), and TensorFlow's start-up prints lines about CUDA and absl logging that jax and torch runs
    have no use for. `TF_CPP_MIN_LOG_LEVEL` does not reach the lines printed before absl's logging
    starts, so standard error (file descriptor 2) points at /dev/null during the import. A TensorFlow
    that fails to import is left alone: the next import (Keras's) raises the error where it is seen.
    """
    if "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is None:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        import tensorflow  # noqa: F401
    except Exception:
        pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_backend(script):
    """Import keras (TensorFlow first, quietly), or return an error line naming KERAS_BACKEND and the fix."""
    quiet_tensorflow()
    try:
        import keras  # noqa: F401
    except Exception as error:  # an unknown or broken backend fails inside keras's import
        return (f"{script}: error: cannot start Keras with KERAS_BACKEND={os.environ.get('KERAS_BACKEND', '(unset)')}: "
                f"{str(error).splitlines()[0] if str(error) else type(error).__name__}; "
                "use jax, tensorflow or torch (pip install -r requirements.txt)")
    if keras.backend.backend() not in ("jax", "tensorflow", "torch"):
        return (f"{script}: error: KERAS_BACKEND={keras.backend.backend()} is not supported by this project; "
                "use jax, tensorflow or torch")
    return None


# --- files -----------------------------------------------------------------------------------------

def write_atomic(path, data):
    """Write bytes or text to `path` through a temporary file and a rename: never half-written. Only the
    chief of several processes writes (`distribution.is_chief`); on the others this does nothing, as
    do `save_checkpoint`, `plot_panels` and `prepare_out_dir`'s creating."""
    if not distribution.is_chief():
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def write_json(path, obj):
    write_atomic(path, json.dumps(obj, indent=2, default=_jsonable) + "\n")


def _jsonable(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return str(value)


def write_csv(path, rows):
    if not rows:
        return
    fields = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, buffer.getvalue())


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def prepare_out_dir(path, flag="--out"):
    """Create `path` and check it can be written, or raise UsageError naming it (the chief alone)."""
    if not distribution.is_chief():
        return path
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-test{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as error:
        raise UsageError(f"{flag} {path}: cannot write there ({error.strerror or error}); choose another directory")
    return path


def open_run_dir(path, resume, what="finished epoch"):
    """The run directory of a training run: created and writable; with `resume` it must hold a run
    (its state.json), without it it must not. Returns (path, path of state.json)."""
    prepare_out_dir(path)
    state_path = os.path.join(path, "state.json")
    if resume and not os.path.exists(state_path):
        raise UsageError(f"--resume: {path} has no {what} to resume from; run without --resume")
    if not resume and os.path.exists(state_path):
        raise UsageError(f"{path} already holds a run; pass --resume to continue it or choose another --out")
    return path, state_path


def run_script(name, argv, parse, check, run, out_dir=lambda args: None):
    """The `main()` of the project's scripts: bad input ends in one line and exit code 2.

    `parse(argv)` and `check(args)` read and check the flags, `run(args)` does the work. A UsageError
    or a DataError prints `NAME: error: ...` and returns 2; if the run
    directory `out_dir(args)` was created by this call and no run in it saved a state.json yet, it is
    removed, so that nothing half-written is left behind (by the chief of several processes, once the
    others have stopped too: `distribution.wait_for_others`). Returns the exit code.
    """
    if any(arg in ("-h", "--help") for arg in argv):
        parse(argv)  # argparse prints the help and exits: no backend is needed for that
    problem = check_backend(name)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    distribution.tune_runtime()
    created = None
    try:
        try:
            args = parse(argv)
        except SystemExit as done:  # argparse has printed its one-line error (OneLineParser)
            return done.code
        check(args)
        out = out_dir(args)
        created = out if out and not os.path.exists(out) else None
        run(args)
    except (UsageError, DataError) as error:
        print(f"{name}: error: {error}", file=sys.stderr, flush=True)
        distribution.wait_for_others()
        if created and distribution.is_chief() and os.path.isdir(created) and not any(
                os.path.exists(os.path.join(root, "state.json")) for root, _, _ in os.walk(created)):
            shutil.rmtree(created, ignore_errors=True)
        return 2
    return 0


def plot_panels(path, xlabel, panels):
    """Side-by-side panels of lines: panels = [(ylabel, {name: (xs, ys, error bars or None)})], each
    with `xlabel` or, as a third element of its tuple, its own."""
    if not distribution.is_chief():
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (ylabel, lines, *own) in zip(axes[0], panels):
        for name, (xs, ys, errs) in lines.items():
            ax.errorbar(xs, ys, yerr=errs, marker="o", markersize=3, capsize=3, label=name)
        ax.set_xlabel(own[0] if own else xlabel)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and updates
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=100)
    os.replace(path + ".tmp.png", path)
    plt.close(fig)


def run_config(args, extra=None, setup=None):
    """What config.json records: the arguments, the backend, the versions, the process settings, and
    the devices of `setup` (a `distribution.Setup`: processes, devices, replicas, distribute_mode)."""
    import keras

    versions = {"python": platform.python_version(), "keras": keras.__version__}
    for name in ("jax", "tensorflow", "torch", "numpy", "sacrebleu"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    config.update(backend=keras.backend.backend(), versions=versions, command=" ".join(sys.argv),
                  runtime=dict(distribution.RUNTIME), **(setup.config() if setup else {}))
    config.update(extra or {})
    return config


# --- checkpoints -----------------------------------------------------------------------------------

def save_checkpoint(model, directory, name):
    """Save model and optimizer state to directory/name.keras atomically; returns the path.

    Several processes: the chief alone writes it. The others save into a temporary directory that is
    then removed: Keras's saving creates a variable, which under a jax distribution or a tf.distribute
    strategy is a step that every process must take (jax checks that the processes agree on its value).
    """
    path = os.path.join(directory, f"{name}.keras")
    if not distribution.is_chief():
        import tempfile

        with tempfile.TemporaryDirectory() as scratch:
            model.save(os.path.join(scratch, f"{name}.keras"))
        return path
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".partial-{os.getpid()}-{name}.keras")  # Keras wants the .keras suffix
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
    import keras

    import models  # noqa: F401  (registers the project's classes for deserialization, with the
    import optimizers  # noqa: F401  optimizer (RAdam) and the learning-rate schedules of the saved
    import schedules  # noqa: F401  optimizer state)

    if os.path.isdir(path):
        raise _CheckpointError("is a directory; pass a .keras file such as runs/NAME/checkpoints/epoch1.keras")
    if not os.path.isfile(path):
        raise _CheckpointError("file not found; pass a .keras file that a run wrote (runs/NAME/checkpoints/)")
    import zipfile

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


def load_latest_checkpoint(directory, upto=None, prefix="epoch", expect=None, report=None, clean=True):
    """The newest checkpoint of a run that loads, falling back past corrupt ones (for --resume).

    directory: the run's checkpoint folder, holding `{prefix}N.keras` files (N = 1, 2, ...) as
        `save_checkpoint(model, directory, f"{prefix}{N}")` writes them.
    upto: ignore files with N > upto (the last epoch that state.json records as finished); None: no bound.
    prefix: the file-name stem before N ("epoch" in train_nmt.py).
    expect: the model class (or tuple of classes) a checkpoint must hold, as in `load_checkpoint`.
    report: called with one warning line when newer checkpoints had to be skipped (default: print
        to stderr).

    clean: remove leftovers of interrupted saves (".partial-*" files) first; False for a reader that
        may run beside the training that writes them.

    Returns (N, model, path) for the largest N whose file loads. Raises UsageError, naming every file
    tried and why it failed, when none loads.
    """
    import re

    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)\.keras$")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    for name in names if clean and distribution.is_chief() else ():
        if name.startswith(".partial-"):
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass
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


def is_finite(value):
    return value is not None and math.isfinite(float(value))


def _duration(seconds):
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
            import keras

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
        eta = _duration(elapsed / done * (self.total - updates)) if done else "-"
        print(f"progress: update {updates}/{self.total} ({100 * updates // max(self.total, 1)}%), loss {loss:.3f}, "
              f"lr {lr:.2e}{rate}, {_duration(elapsed)} elapsed, ETA {eta}", file=self.stream, flush=True)

    def pause(self):
        """Before other output (validation lines): end the bar's line on a terminal."""
        if self.bar:
            print(file=self.stream)


# --- backend-specific: gradients -------------------------------------------------------------------

_JAX_GRAD_FNS = {}


def loss_and_gradients(model, compute_loss, inputs, targets):
    """(loss, [dloss/dw for w in model.trainable_variables]) as float64 numpy, with the backend's autodiff.

    `compute_loss(targets, outputs)` maps the model's outputs to a scalar. Dropout is off
    (training=False).
    """
    import keras

    backend = keras.backend.backend()
    variables = model.trainable_variables
    if backend == "jax":
        import jax

        # One compilation per architecture and loss: models that differ only in their weights share it,
        # since stateless_call takes the variable values as arguments.
        config = {k: v for k, v in model.get_config().items() if k != "name"}
        key = (type(model).__name__, json.dumps(config, sort_keys=True, default=str), id(compute_loss))
        if key not in _JAX_GRAD_FNS:

            def loss_fn(trainable, non_trainable, batch, labels, traced=model):
                outputs, _ = traced.stateless_call(trainable, non_trainable, batch, training=False)
                return compute_loss(labels, outputs)

            _JAX_GRAD_FNS[key] = jax.jit(jax.value_and_grad(loss_fn))
        loss, grads = _JAX_GRAD_FNS[key]([v.value for v in variables],
                                         [v.value for v in model.non_trainable_variables], inputs, targets)
    elif backend == "tensorflow":
        import tensorflow as tf

        def loss_and_grads():
            with tf.GradientTape() as tape:
                loss = compute_loss(targets, model(inputs, training=False))
            return [loss] + tape.gradient(loss, variables)

        if tf.distribute.in_cross_replica_context() and tf.distribute.has_strategy():
            # Mirrored variables are differentiable only inside a replica: every replica computes the
            # whole batch with its loss divided by the replica count (Keras's scaling), so the sum is exact.
            strategy = tf.distribute.get_strategy()
            per_replica = strategy.run(loss_and_grads)
            loss, *grads = [strategy.reduce("SUM", value, axis=None) for value in per_replica]
        else:
            loss, *grads = loss_and_grads()
    elif backend == "torch":
        import torch

        loss = compute_loss(targets, model(inputs, training=False))
        grads = torch.autograd.grad(loss, [v.value for v in variables])
    else:
        raise UsageError(f"KERAS_BACKEND={backend} is not supported; use jax, tensorflow or torch")
    to_numpy = keras.ops.convert_to_numpy
    return float(to_numpy(loss)), [np.asarray(to_numpy(g), dtype="float64") for g in grads]


# --- backend-specific: compiling a method ----------------------------------------------------------

def compiled(model, method):
    """`method` (a bound method of `model` using only keras.ops) compiled for repeated calls.

    jax: jax.jit with the model's variables passed as arguments (a StatelessScope maps them), so the
    weights are not baked into the program; tensorflow: tf.function with XLA; torch: eager, as is.
    Integer positions should be passed as tensors, so that one compilation serves every position.

    Tensorflow uses XLA here on CPU too, unlike the train step (`distribution.compile_xla`): a decoding
    step is many small operations, and beam 5 on the benchmark's 32 sentences ran at 4.4-5.0 sentences/s
    with XLA and 4.0-4.9 without in mixed_bfloat16 (4.3-4.7 and 4.1-4.7 in float32).
    """
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        variables = model.variables

        @jax.jit
        def run(values, *args):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return method(*args)

        return lambda *args: run([v.value for v in variables], *args)
    if backend == "tensorflow":
        import tensorflow as tf

        # XLA cannot place mirrored variables of a tf.distribute strategy over CPU devices.
        xla = not tf.distribute.has_strategy() or bool(tf.config.list_logical_devices("GPU"))
        return tf.function(method, jit_compile=xla, reduce_retracing=True)
    import torch

    return torch.no_grad()(method)  # eager; no autograd graph while decoding
