"""The backend-specific helpers of the project, each a small function with one branch per backend:
`loss_and_gradients` (each backend's own autodiff, for the analyses and the gradient-norm probe),
`compiled` (jax.jit / tf.function with XLA / eager torch, for decoding), `schedule_rate` (a learning rate
read for the logs in one compiled program on jax), `compile_clock` (the seconds spent compiling, on
jax), `seed_dropout` (torch's dropout masks a function of the seed and the update, so that a resumed
run draws an uninterrupted one's) and `tf_split` (a global batch as tf.distribute's per-replica slices).
Everything else is backend-free.
"""

import contextlib
import functools
import json

import keras
import numpy as np

from harness.console import UsageError

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

    Tensorflow uses XLA here on CPU too, unlike the train step (`devices.compile_xla`): a decoding
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


def lr_at(schedule, step):
    """The learning rate of update step + 1 (a schedule, or a constant)."""
    return schedule_rate(schedule, step) if callable(schedule) else float(schedule)


def schedule_rate(schedule, step):
    """`schedule(step)` as a float, for the logs. jax compiles every operation run outside a compiled
    function into a program of its own (a schedule's few operations made 8 of a tiny run's 56 programs),
    so there the schedule is compiled whole, once, with the step as an argument; the other backends run it
    eagerly without compiling."""
    if keras.backend.backend() == "jax":
        return float(_jax_schedule(schedule)(np.int32(step)))
    return float(keras.ops.convert_to_numpy(schedule(step)))


@functools.lru_cache(maxsize=32)
def _jax_schedule(schedule):
    import jax

    return jax.jit(schedule.__call__)


# --- backend-specific: time spent compiling ---------------------------------------------------------

# jax's events for the three stages of a compilation, as jax 0.10.2 names them in its dispatch module: tracing
# the Python function, lowering its jaxpr to MLIR, and XLA's compile (or loading it from a cache).
JAX_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                      "/jax/core/compile/backend_compile_duration")


@contextlib.contextmanager
def compile_clock():
    """`with compile_clock() as clock:` ... `clock.seconds`: the seconds spent compiling inside the block.

    jax: the sum of jax.monitoring's duration events of each compilation (tracing, lowering, XLA), so
    every train-step shape, evaluation shape and decoding step counts. tensorflow and torch: None (the
    train step runs as a graph without XLA on CPU, or eagerly; there is no compile to time).
    """
    clock = _Clock()
    if keras.backend.backend() != "jax":
        yield clock
        return
    import jax.monitoring

    clock.seconds, clock.programs = 0.0, 0

    def listen(event, duration, **kwargs):
        if event in JAX_COMPILE_EVENTS:
            clock.seconds += duration
        if event == JAX_COMPILE_EVENTS[-1]:
            clock.programs += 1

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield clock
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


class _Clock:
    seconds = None  # seconds spent compiling (jax), else None
    programs = None  # XLA programs compiled or loaded from the compilation cache (jax), else None


# --- backend-specific: torch's dropout masks --------------------------------------------------------

def seed_dropout(seed, update):
    """torch: seed torch's global generator from (`seed`, `update`) before update `update` + 1, so that its
    dropout masks are a function of the two, as the batches are: Keras's Dropout without a seed draws
    from that generator on torch (torch's own dropout, its fast path), which other code draws from too
    (each epoch's DataLoader), so a resumed run could not take its state from a checkpoint. jax and
    tensorflow: nothing (their masks come from the model's generators, which a checkpoint carries:
    `rundir.random_state`)."""
    if keras.backend.backend() == "torch":
        import torch

        torch.manual_seed((seed * 1_000_003 + update) % 2**63)


# --- backend-specific: tf.distribute's per-replica batches ------------------------------------------

def tf_split(strategy, batch, replicas):
    """Per-replica slices of a padded global batch, as tf.distribute DistributedValues."""
    import tensorflow as tf

    def slice_for(context):
        i = context.replica_id_in_sync_group
        rows = keras.tree.flatten(batch)[0].shape[0] // replicas
        return keras.tree.map_structure(lambda a: tf.constant(a[i * rows:(i + 1) * rows]), batch)

    return strategy.experimental_distribute_values_from_function(slice_for)
