"""Devices, distribution and precision: the one place train_nmt.py and pretrain_bert.py set them up; and the
backend-specific helpers (gradients, compiling a method, the rate of a schedule: the section at the end).

    --distribute auto|none|data|model   --model-parallel N   --precision float32|mixed_bfloat16|mixed_float16

The global batch stays what `--max-tokens` (or `--batch-size`) says whatever the device count, so a run
gives the same curves on one device or on eight. This module is backend-specific by nature; each
backend has its own small, marked function:

- jax: `keras.distribution.DataParallel` over all devices (data), or a `ModelParallel` layout on a
  (batch, model) device mesh that splits attention and FFN kernels over the `model` axis
  (Megatron-style: W^Q, W^K, W^V and W^1 by columns, W^O and W^2 by rows). Several hosts: set
  JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID on each; `jax.distributed.initialize`
  then joins them (CPU collectives through gloo), and `DataParallel` spans every process's devices.
- tensorflow: `tf.distribute.MirroredStrategy` over the local GPUs (or logical CPUs), or
  `MultiWorkerMirroredStrategy` when TF_CONFIG describes several workers. The model is built and
  compiled in the strategy's scope; `shard` splits each global batch into one slice per replica. Each
  replica's loss is the mean over its own tokens and Keras averages them, which equals the global
  token mean when the slices hold equal token counts (jax computes the global mean exactly; with
  several workers the scripts weight each replica by its share of the tokens: harness/callbacks.py).
- torch: one device.

Several processes (docs/several-hosts.md; harness/files.py joins them, and `configure` calls it): each reads
the whole global batch and feeds its own rows (`Setup.feed`, `Setup.shard`);
process 0 alone writes the run's files, and `Setup.config()` gives config.json its device fields.

`tune_runtime` holds two process-wide settings for speed (memory kept by malloc; jax's dropout
generator) that every script applies at start.

Precision goes through Keras dtype policies: variables stay float32, layers compute in bfloat16 or
float16; LayerNorm (Keras computes it in float32), the attention softmax and the loss run in float32
(see layers.py and models.py), and mixed_float16 gets Keras's dynamic loss scaling at compile time.
"""

import contextlib
import ctypes
import functools
import json
import os
import platform

import keras
import numpy as np

from harness import files, private_api
from harness.console import UsageError
from harness.specs import PEER_TIMEOUT_S, check_distribution_arguments


# ModelParallel layout for the project's layer names (layers.py): the path of each kernel ends in
# <attention>/{query,key,value,output}/kernel or feed_forward/{w1,w2}/kernel.
MODEL_PARALLEL_LAYOUT = {
    ".*/(query|key|value)/kernel": (None, "model"),
    ".*/(query|key|value)/bias": ("model",),
    ".*/output/kernel": ("model", None),
    ".*/feed_forward/w1/kernel": (None, "model"),
    ".*/feed_forward/w1/bias": ("model",),
    ".*/feed_forward/w2/kernel": ("model", None),
}


class Setup:
    """What `configure` chose: `replicas` (data-parallel copies of the model), a `scope()` to build and
    compile the model in, and `shard(batch)` to hand a global batch to `train_on_batch`."""

    def __init__(self, mode, devices, replicas=1, strategy=None, description=""):
        self.mode, self.devices, self.replicas, self.strategy = mode, devices, replicas, strategy
        self.description = description
        self.processes, self.process_index = files.process_count(), files.process_index()

    def config(self):
        """What config.json records about the devices: processes, devices in all, data-parallel replicas."""
        return dict(processes=self.processes, devices=len(self.devices), replicas=self.replicas,
                    distribute_mode=self.mode,  # the spec's distribute keeps what was asked ("auto")
                    runtime=dict(RUNTIME))

    def scope(self):
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    def pad(self, batch):
        """Pad the rows of a batch (nested arrays) with padding rows (id 0, which the token losses
        ignore) to a multiple of the replica count; a padding row adds nothing to the loss or gradient."""
        rows = keras.tree.flatten(batch)[0].shape[0]
        extra = -rows % self.replicas
        if not extra:
            return batch
        return keras.tree.map_structure(lambda a: np.concatenate([a, np.zeros((extra,) + a.shape[1:], a.dtype)]), batch)

    def build(self, model, batch):
        """Build what the first step would otherwise build while it is traced: the optimizer's slots, in
        this setup's scope (Keras 3.15 on TensorFlow without a strategy creates them inside the traced step,
        each behind a tf.cond: the cpu preset's first step traced in twice the time), and under a
        tf.distribute strategy the compiled loss and metrics on one plain batch (`train_on_batch` cannot
        build them from per-replica slices). The numbers are the same either way."""
        with self.scope():  # a strategy's slots are made in its scope, wherever this is called from
            if not model.optimizer.built:  # a resumed model's is (and LossScaleOptimizer.build would add its twice)
                model.optimizer.build(model.trainable_variables)
        if self.strategy is not None:
            model.test_on_batch(*self.pad(batch))

    def shard(self, batch):
        """The global batch in the form `train_on_batch` wants: as it is (one device; jax shards it
        itself), this process's rows of it (jax, several processes: Keras assembles the global array
        from each process's rows), or split into per-replica slices for a tf.distribute strategy
        (each worker's replicas take their own slices)."""
        batch = self.pad(batch)
        if self.strategy is not None:
            return tf_split(self.strategy, batch, self.replicas)
        return self.process_rows(batch)

    def process_rows(self, batch):
        """This process's rows of a padded global batch: process i of n takes the i-th of n equal
        runs of rows (the padding rows, if any, fall in the last ones)."""
        if self.processes == 1:
            return batch
        rows = keras.tree.flatten(batch)[0].shape[0] // self.processes
        start = self.process_index * rows
        return keras.tree.map_structure(lambda a: a[start:start + rows], batch)

    def feed(self, batch):
        """What the training input of `model.fit` holds for a global batch (the scripts' datasets
        apply it): the padded batch, and with several jax processes this process's rows of it (Keras
        makes the global arrays from every process's rows). Under a tf.distribute strategy the whole
        padded batch: `callbacks.fit` hands it to `shard` itself. One process: `pad(batch)`, as it is."""
        batch = self.pad(batch)
        return batch if self.strategy is not None else self.process_rows(batch)


def configure(devices):
    """Set the dtype policy and the distribution that `devices` (a spec's devices part: --distribute,
    --model-parallel, --precision, --peer-timeout) ask for; returns a Setup.

    Call it once, before any model is built.
    """
    check_distribution_arguments(devices)
    keras.config.set_dtype_policy(devices.precision)
    backend = keras.backend.backend()
    timeout = peer_timeout(devices)
    files.join(backend, timeout)  # several processes as one (JAX_*, TF_CONFIG); one process: nothing to do
    configure_backend = {"jax": _configure_jax, "tensorflow": _configure_tensorflow}.get(backend, _configure_torch)
    setup = configure_backend(devices)
    files.start(backend, setup, timeout)  # then watch the others, and quiet all but the chief
    return setup


def peer_timeout(devices):
    """--peer-timeout of a spec's devices part (scripts and tests without the flag: its default)."""
    return getattr(devices, "peer_timeout", PEER_TIMEOUT_S)


# --- backend-specific: process settings for speed ----------------------------------------------------

JAX_DROPOUT_RNG = "philox4x32"
RUNTIME = {}  # what tune_runtime() set, for config.json and the benchmark line


def tune_runtime():
    """Process-wide settings: two make the jax train step about 1.6x faster on CPU, the third keeps jax's
    compiled programs between processes; the jobs call this once at start, before anything compiles
    (`run` in harness/nmt_job.py, harness/bert_job.py and harness/grads_job.py; `benchmark.benchmark`), the tests too. Returns
    what it set.

    1. Keep freed memory in the process (glibc on Linux; elsewhere nothing to do). XLA allocates one
       block for a whole step's temporaries (4.4 GB in `train_nmt.py --benchmark`) and frees it after
       the step. glibc returns such blocks to the kernel, so the next step faults in ~1.1 million fresh
       4 KiB pages again, which cost ~3 s of a 10 s step here. With one malloc arena, no mmap'ed blocks
       and no trimming, the block is reused: 0 page faults a step. The process keeps its peak
       memory instead of giving it back between steps.
    2. jax: dropout masks from Philox-4x32-10 (the counter-based generator behind PyTorch's CUDA
       random numbers) instead of jax's default threefry2x32, whose CPU lowering is a rolled loop that
       re-reads the whole mask five times: dropout went from ~15 % of the step to ~2 %. Keras seeds
       are 2-word keys, which both generators take, so seeding and resuming work as before; the random
       numbers (initial weights too) differ from threefry's.
    3. jax: the persistent compilation cache (`compilation_cache_dir`), so that a second run of the same
       shapes (a sweep's runs, the test suite, the same command again) loads its programs instead of
       compiling them; for a process that trains alone (not with several processes as one).
    """
    if RUNTIME:
        return dict(RUNTIME)
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        libc = ctypes.CDLL(None)
        m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8  # <malloc.h>
        # A trim threshold of -1 is SIZE_MAX: never trim.
        if all(libc.mallopt(p, v) == 1 for p, v in ((m_arena_max, 1), (m_mmap_max, 0), (m_trim_threshold, -1))):
            RUNTIME["malloc"] = "keep freed memory (glibc: 1 arena, no mmap, no trim)"
    if keras.backend.backend() == "jax":
        import jax

        jax.config.update("jax_default_prng_impl", JAX_DROPOUT_RNG)
        RUNTIME["jax_prng"] = JAX_DROPOUT_RNG
        # One process alone: processes training together compile their programs in step, and one that
        # loads a program from the cache while another compiles it was seen to leave the other waiting.
        cache = None if files.several_named() or files.process_count() > 1 else compilation_cache_dir()
        if cache:
            jax.config.update("jax_compilation_cache_dir", cache)
            # Every program, however quick to compile: jax's default keeps only those that took 1 s or more,
            # so a run's many small programs (decoding steps, evaluation) were compiled again each time.
            jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
            jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
            jax.config.update("jax_compilation_cache_max_size", COMPILATION_CACHE_BYTES)
            RUNTIME["compilation_cache"] = cache
    return dict(RUNTIME)


COMPILATION_CACHE_BYTES = 4 << 30  # the oldest programs go first beyond 4 GiB


def compilation_cache_dir(environ=None):
    """Where jax keeps compiled programs between processes (3. of `tune_runtime`), or None when
    LNPLACE_COMPILATION_CACHE=0 turns the cache off: JAX_COMPILATION_CACHE_DIR if set, else the user's
    cache folder, $XDG_CACHE_HOME/lnplace/jax or ~/.cache/lnplace/jax. Delete the folder to clear it."""
    environ = os.environ if environ is None else environ
    if environ.get("LNPLACE_COMPILATION_CACHE", "1").lower() in ("0", "off", "no", "false"):
        return None
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return environ["JAX_COMPILATION_CACHE_DIR"]
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "lnplace", "jax")


def _check_several(settings):
    if settings.distribute == "none":
        raise UsageError(f"--distribute none trains in one process, but {files.process_count()} were started "
                         "(JAX_NUM_PROCESSES or TF_CONFIG); use --distribute auto or data, or start one process")


def _check_model_parallel(settings, count):
    if settings.model_parallel > count or count % settings.model_parallel:
        raise UsageError(f"--model-parallel {settings.model_parallel} asks for more devices than the {count} there are "
                         f"(or does not divide them); use a divisor of {count}, or --distribute data")


# --- backend-specific: jax ---------------------------------------------------------------------------

def _configure_jax(settings):
    import jax

    devices = jax.devices()  # every process's devices (configure() joined the processes first)
    mode = settings.distribute
    if files.process_count() > 1:
        _check_several(settings)
    if mode == "auto":
        mode = "data" if len(devices) > 1 else "none"
    if mode == "none":
        keras.distribution.set_distribution(None)
        return Setup("none", devices[:1], description=f"one device ({devices[0].platform})")
    if mode == "data":
        # Several processes: each feeds its own rows (Setup.feed, Setup.shard), so Keras must
        # not shard a tf.data input again.
        keras.distribution.set_distribution(keras.distribution.DataParallel(
            devices=devices, auto_shard_dataset=files.process_count() == 1))
        over = f" in {files.process_count()} processes" if files.process_count() > 1 else ""
        return Setup("data", devices, replicas=len(devices),
                     description=f"jax DataParallel over {len(devices)} {devices[0].platform} devices{over}")
    _check_model_parallel(settings, len(devices))
    batch = len(devices) // settings.model_parallel
    mesh = keras.distribution.DeviceMesh((batch, settings.model_parallel), ("batch", "model"), devices=devices)
    layout = keras.distribution.LayoutMap(mesh)
    for pattern, axes in MODEL_PARALLEL_LAYOUT.items():
        layout[pattern] = axes
    keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch"))
    return Setup("model", devices, replicas=batch,
                 description=f"jax ModelParallel: mesh batch {batch} x model {settings.model_parallel}")


# --- backend-specific: tensorflow --------------------------------------------------------------------

def _configure_tensorflow(settings):
    import tensorflow as tf

    if settings.distribute == "model":
        raise UsageError("--distribute model is implemented for KERAS_BACKEND=jax; with tensorflow use "
                         "--distribute data")
    workers = files.process_count()
    if workers > 1:
        _check_several(settings)
        # Created before anything starts tensorflow's runtime; collectives (ring all-reduce) time out
        # after --peer-timeout s instead of waiting forever.
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=peer_timeout(settings))
        strategy = files.tf_join_workers(options, workers)
        private_api.patch_keras_multi_worker_reduce()
        description = f"tf MultiWorkerMirroredStrategy over {workers} workers"
        mine = strategy.extended.worker_devices  # this worker's; every worker has as many
        devices = [d.replace(f"task:{strategy.cluster_resolver.task_id}", f"task:{i}")
                   for i in range(workers) for d in mine]
        return Setup("data", devices, replicas=strategy.num_replicas_in_sync, strategy=strategy,
                     description=f"{description} ({strategy.num_replicas_in_sync} replicas)")
    gpus = tf.config.list_logical_devices("GPU")
    devices = gpus or tf.config.list_logical_devices("CPU")
    mode = settings.distribute
    if mode == "auto":
        mode = "data" if len(devices) > 1 else "none"
    if mode == "none":
        return Setup("none", devices[:1], description=f"one device ({devices[0].name})")
    strategy = tf.distribute.MirroredStrategy([d.name for d in devices])
    description = f"tf MirroredStrategy over {len(devices)} devices"
    return Setup("data", devices, replicas=strategy.num_replicas_in_sync, strategy=strategy,
                 description=f"{description} ({strategy.num_replicas_in_sync} replicas)")


def compile_xla(setup):
    """Whether the train step uses XLA (Keras's jit_compile).

    jax: always (jax.jit is XLA). torch: never (eager). tensorflow: on GPUs only. On CPU, graph mode
    with oneDNN kernels trained faster than XLA here (`train_nmt.py --benchmark`: 628-640 against
    550-569 target tokens/s; results/speed/README.md), and bfloat16 matrix products run
    at twice the float32 rate only through oneDNN; XLA also cannot place the mirrored variables of a
    tf.distribute strategy over CPU devices. (Decoding steps keep XLA on CPU: `devices.compiled`.)
    """
    backend = keras.backend.backend()
    if backend == "torch":
        return False
    if backend == "tensorflow":
        return bool(setup.devices) and all("GPU" in getattr(d, "name", d) for d in setup.devices)
    return True


# --- backend-specific: torch -------------------------------------------------------------------------

def _configure_torch(asked):
    import torch

    cuda = torch.cuda.device_count()
    if asked.distribute in ("data", "model"):
        raise UsageError(f"--distribute {asked.distribute}: KERAS_BACKEND=torch trains on one device here; "
                         "use KERAS_BACKEND=jax (data or model) or tensorflow (data) to use several")
    device = "cuda" if cuda else "cpu"
    note = f" ({cuda} GPUs seen; jax or tensorflow use them all)" if cuda > 1 else ""
    return Setup("none", [device], description=f"one device ({device}){note}")


# The backend-specific helpers of the project, each a small function with one branch per backend:
# `loss_and_gradients` (each backend's own autodiff, for the analyses and the gradient-norm probe),
# `compiled` (jax.jit / tf.function with XLA / eager torch, for decoding), `schedule_rate` (a learning rate
# read for the logs in one compiled program on jax), `compile_clock` (the seconds spent compiling, on
# jax), `seed_dropout` (torch's dropout masks a function of the seed and the update, so that a resumed
# run draws an uninterrupted one's) and `tf_split` (a global batch as tf.distribute's per-replica slices).
# Everything else is backend-free.


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
