"""What the training jobs share on the Keras side: config.json's record, checkpoints, progress, and the
backend-specific helpers (run directories and files without Keras: runs.py).

The backend-specific code of the project lives here, in two small marked functions:
`loss_and_gradients` (each backend's own autodiff) and `compiled` (jax.jit / tf.function / eager torch).
Everything else is backend-free.
"""

import json
import os
import platform
import re
import sys
import tempfile
import time
import zipfile

import keras
import numpy as np

import distribution
import models  # noqa: F401  (registers the project's classes for deserialization, with the optimizer
import optimizers  # noqa: F401  (RAdam) and the learning-rate schedules of a saved optimizer's state)
import schedules  # noqa: F401
from errors import UsageError
from processes import is_chief


# --- config.json -----------------------------------------------------------------------------------

def run_config(args, extra=None, setup=None):
    """What config.json records: the arguments, the backend, the versions, the process settings, and
    the devices of `setup` (a `distribution.Setup`: processes, devices, replicas, distribute_mode)."""
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
    if not is_chief():
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
    pattern = re.compile(rf"^{re.escape(prefix)}(\d+)\.keras$")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    for name in names if clean and is_chief() else ():
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
