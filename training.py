"""What the scripts share: run directories, atomic files, checkpoints, and the backend-specific helpers.

The backend-specific code of the project lives here, in two small marked functions:
`loss_and_gradients` (each backend's own autodiff) and `compiled` (jax.jit / tf.function / eager torch).
Everything else is backend-free.
"""

import csv
import io
import json
import math
import os
import platform
import sys

import numpy as np


class UsageError(ValueError):
    """Bad command-line input or files: the scripts print it as one line and exit with code 2."""


def check_backend(script):
    """Import keras, or return an error line naming KERAS_BACKEND and the fix."""
    try:
        import keras  # noqa: F401
    except Exception as error:  # an unknown or broken backend fails inside keras's import
        return (f"{script}: error: cannot start Keras with KERAS_BACKEND={os.environ.get('KERAS_BACKEND', '(unset)')}: "
                f"{str(error).splitlines()[0] if str(error) else type(error).__name__}; "
                "use jax, tensorflow or torch (pip install -r requirements.txt)")
    return None


# --- files -----------------------------------------------------------------------------------------

def write_atomic(path, data):
    """Write bytes or text to `path` through a temporary file and a rename: never half-written."""
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
    """Create `path` and check it can be written, or raise UsageError naming it."""
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-test{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as error:
        raise UsageError(f"{flag} {path}: cannot write there ({error.strerror or error}); choose another directory")
    return path


def run_config(args, extra=None):
    """What config.json records: the arguments, the backend, the versions."""
    import keras

    versions = {"python": platform.python_version(), "keras": keras.__version__}
    for name in ("jax", "tensorflow", "torch", "numpy", "sacrebleu"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    config.update(backend=keras.backend.backend(), versions=versions, command=" ".join(sys.argv))
    config.update(extra or {})
    return config


# --- checkpoints -----------------------------------------------------------------------------------

def save_checkpoint(model, directory, name):
    """Save model and optimizer state to directory/name.keras atomically; returns the path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.keras")
    tmp = os.path.join(directory, f".partial-{os.getpid()}-{name}.keras")  # Keras wants the .keras suffix
    model.save(tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path):
    """Load a .keras checkpoint (model with its optimizer), or raise UsageError naming the problem."""
    import keras

    import models  # noqa: F401  (registers the project's classes for deserialization)

    if not os.path.isfile(path):
        raise UsageError(f"checkpoint {path}: file not found")
    try:
        return keras.models.load_model(path)
    except Exception as error:  # zip, json or weight-shape errors from inside Keras
        raise UsageError(f"checkpoint {path} cannot be loaded ({type(error).__name__}: "
                         f"{str(error).splitlines()[0][:200] if str(error) else ''}); it is corrupt or from "
                         "another architecture: remove it or start a new --out") from None


def is_finite(value):
    return value is not None and math.isfinite(float(value))


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

        with tf.GradientTape() as tape:
            loss = compute_loss(targets, model(inputs, training=False))
        grads = tape.gradient(loss, variables)
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

        return tf.function(method, jit_compile=True, reduce_retracing=True)
    import torch

    return torch.no_grad()(method)  # eager; no autograd graph while decoding
