"""Devices, distribution and precision: the one place train_nmt.py and pretrain_bert.py set them up.

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

Several processes (docs/several-hosts.md; harness/processes.py joins them, and `configure` calls it): each reads
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
import os
import platform

import keras
import numpy as np

from harness import private_api, processes
from harness.backend import tf_split
from harness.specs import PEER_TIMEOUT_S
from harness.console import UsageError
from harness.specs import check_distribution_arguments


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
        self.processes, self.process_index = processes.process_count(), processes.process_index()

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
        """Under a tf.distribute strategy, let Keras build the compiled loss and metrics on one plain
        batch (`train_on_batch` cannot build them from per-replica slices); elsewhere nothing to do."""
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
    processes.join(backend, timeout)
    configure_backend = {"jax": _configure_jax, "tensorflow": _configure_tensorflow}.get(backend, _configure_torch)
    setup = configure_backend(devices)
    processes.start(backend, setup, timeout)
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
        cache = None if processes.several_named() or processes.process_count() > 1 else compilation_cache_dir()
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
        raise UsageError(f"--distribute none trains in one process, but {processes.process_count()} were started "
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
    if processes.process_count() > 1:
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
            devices=devices, auto_shard_dataset=processes.process_count() == 1))
        over = f" in {processes.process_count()} processes" if processes.process_count() > 1 else ""
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
    workers = processes.process_count()
    if workers > 1:
        _check_several(settings)
        # Created before anything starts tensorflow's runtime; collectives (ring all-reduce) time out
        # after --peer-timeout s instead of waiting forever.
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=peer_timeout(settings))
        strategy = processes.tf_join_workers(options, workers)
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
    tf.distribute strategy over CPU devices. (Decoding steps keep XLA on CPU: `backend.compiled`.)
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
