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
  several workers the scripts weight each replica by its share of the tokens: callbacks.py).
- torch: one device.

Several processes (docs/several-hosts.md): each reads the whole global batch and feeds its own rows
(`Setup.shard`, `Setup.process_batches`, `Setup.feed`); `is_chief()` (process 0) is the one to write
checkpoints, metrics and config.json (`Setup.config()` gives its device fields): training.py's writers
do nothing on the others, whose standard output goes to /dev/null (`_quiet_stdout`), and `chief_first`
lets the chief write what the others then read (the vocabulary). A process that dies makes the others
exit within `--peer-timeout` seconds with one line naming it (exit code 3, `PEER_EXIT_CODE`) instead of
waiting for it forever.

`tune_runtime` holds two process-wide settings for speed (memory kept by malloc; jax's dropout
generator) that every script applies at start.

Precision goes through Keras dtype policies: variables stay float32, layers compute in bfloat16 or
float16; LayerNorm (Keras computes it in float32), the attention softmax and the loss run in float32
(see layers.py and models.py), and mixed_float16 gets Keras's dynamic loss scaling at compile time.
"""

import contextlib
import json
import os
import sys
import time

import numpy as np

from errors import UsageError

MODES = ("auto", "none", "data", "model")
PEER_TIMEOUT_S = 60
EXIT_WAIT_S = 300  # jax: how long a process that is done waits at exit for the others to be done too
PEER_EXIT_CODE = 3  # a process of the run died or stopped answering; 2 stays "bad input"
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")

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


def add_arguments(parser):
    group = parser.add_argument_group("devices and precision")
    group.add_argument("--distribute", default="auto", choices=MODES, help="auto: data parallel when there are "
                       "several devices; model: jax, shard attention and FFN kernels (default: %(default)s)")
    group.add_argument("--model-parallel", type=int, default=2,
                       help="devices along the model axis with --distribute model (default: %(default)s)")
    group.add_argument("--precision", default="float32", choices=PRECISIONS,
                       help="Keras dtype policy (default: %(default)s)")
    group.add_argument("--peer-timeout", type=int, default=PEER_TIMEOUT_S,
                       help="several processes (docs/several-hosts.md): seconds to wait for the others to join, "
                       "or for one that stopped answering, before the run ends with a message (exit code 3)")


def check_arguments(args):
    if args.distribute not in MODES:
        raise UsageError(f"--distribute {args.distribute}: unknown; choose from {', '.join(MODES)}")
    if args.precision not in PRECISIONS:
        raise UsageError(f"--precision {args.precision}: unknown; choose from {', '.join(PRECISIONS)}")
    if args.model_parallel < 1:
        raise UsageError(f"--model-parallel must be a positive integer, got {args.model_parallel}")
    if getattr(args, "peer_timeout", PEER_TIMEOUT_S) < 1:
        raise UsageError(f"--peer-timeout must be a positive number of seconds, got {args.peer_timeout}")


class Setup:
    """What `configure` chose: `replicas` (data-parallel copies of the model), a `scope()` to build and
    compile the model in, and `shard(batch)` to hand a global batch to `train_on_batch`."""

    def __init__(self, mode, devices, replicas=1, strategy=None, description=""):
        self.mode, self.devices, self.replicas, self.strategy = mode, devices, replicas, strategy
        self.description = description
        self.processes, self.process_index = process_count(), process_index()

    def config(self):
        """What config.json records about the devices: processes, devices in all, data-parallel replicas."""
        return dict(processes=self.processes, devices=len(self.devices), replicas=self.replicas,
                    distribute_mode=self.mode)  # args.distribute keeps what was asked ("auto")

    def scope(self):
        return self.strategy.scope() if self.strategy is not None else contextlib.nullcontext()

    def pad(self, batch):
        """Pad the rows of a batch (nested arrays) with padding rows (id 0, which the token losses
        ignore) to a multiple of the replica count; a padding row adds nothing to the loss or gradient."""
        import keras

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
            return _tf_split(self.strategy, batch, self.replicas)
        return self.process_rows(batch)

    def process_rows(self, batch):
        """This process's rows of a padded global batch: process i of n takes the i-th of n equal
        runs of rows (the padding rows, if any, fall in the last ones)."""
        if self.processes == 1:
            return batch
        import keras

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

    def process_batches(self, batches):
        """What `model.fit` takes for an iterable of global batches: a generator of this process's rows
        of each (jax: Keras makes the global arrays from every process's rows). Not under a
        tf.distribute strategy: Keras 3.15's `fit` over a distributed dataset of dict inputs fails in
        its symbolic build (`strategy.reduce` of a nested structure); there `train_on_batch` takes
        `shard(batch)`."""
        if self.strategy is not None:
            raise NotImplementedError("tf.distribute: train with train_on_batch(*setup.shard(batch))")
        return (self.process_rows(self.pad(batch)) for batch in batches)


def configure(args):
    """Set the dtype policy and the distribution that `args` ask for; returns a Setup.

    Call it once, before any model is built.
    """
    import keras

    check_arguments(args)
    keras.config.set_dtype_policy(args.precision)
    backend = keras.backend.backend()
    timeout = getattr(args, "peer_timeout", PEER_TIMEOUT_S)
    if backend == "jax":
        _join_jax(timeout)
    elif backend == "tensorflow":
        _join_tensorflow()
    elif os.environ.get("JAX_COORDINATOR_ADDRESS") or _tf_cluster_size() > 1:
        raise UsageError("several processes (JAX_COORDINATOR_ADDRESS or TF_CONFIG set) need KERAS_BACKEND=jax or "
                         "tensorflow; KERAS_BACKEND=torch trains in one process here")
    if backend == "jax":
        setup = _configure_jax(args)
    elif backend == "tensorflow":
        setup = _configure_tensorflow(args)
    else:
        setup = _configure_torch(args)
    if PROCESS["count"] > 1:
        _watch_peers(backend, setup, timeout)
        PROCESS["tell"], PROCESS["hear"] = _chief_messages(backend, setup, timeout)
        if not is_chief():  # the chief speaks for the run; errors and warnings still go to standard error
            _quiet_stdout()
    return setup


# --- several processes -------------------------------------------------------------------------------

PROCESS = dict(count=1, index=0)  # set when configure() joins several processes


def process_count():
    """How many processes train together (1 unless JAX_* variables or TF_CONFIG name several)."""
    return PROCESS["count"]


def process_index():
    """This process's place among them, 0 .. process_count() - 1."""
    return PROCESS["index"]


def is_chief():
    """Whether this process writes the run's files (checkpoints, metrics, config.json): process 0."""
    return PROCESS["index"] == 0


def chief_first(work):
    """`work()` on the chief, then on the other processes once it is done: what the chief writes into
    the run directory (the vocabulary, a prepared corpus) the others then find there and read. Several
    hosts need the run directory on a shared file system (docs/several-hosts.md). When `work()` fails
    on the chief, the others raise a UsageError saying so instead of waiting."""
    if process_count() == 1:
        return work()
    PROCESS["steps"] = step = PROCESS.get("steps", 0) + 1
    if is_chief():
        try:
            result = work()
        except BaseException as error:
            PROCESS["tell"](step, f"{type(error).__name__}: {error}")
            raise
        PROCESS["tell"](step, "")
        return result
    problem = PROCESS["hear"](step)
    if problem:
        raise UsageError(f"process 0 (the chief) stopped: {problem}")
    return work()


def wait_for_others():
    """After a UsageError or DataError: wait (at most --peer-timeout s) until the other processes have
    stopped too, which they do on the same bad input, before the chief removes the run directory it
    created (`training.run_script`): the others may still be reading the vocabulary there."""
    if process_count() > 1:
        try:
            PROCESS["wait"]()
        except Exception:  # a process that did not fail, or is gone: nothing more to wait for
            pass


def _quiet_stdout():
    """Standard output (file descriptor 1, so the libraries' output too) to /dev/null from here on."""
    sys.stdout.flush()
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 1)


def _chief_messages(backend, setup, timeout):
    """(tell, hear): the chief tells the others that step N of `chief_first` is done ("" or what went
    wrong), and they wait to hear it. jax: the coordination service's key-value store; a wait lasts as
    long as the chief works (learning a vocabulary can take minutes), while `_watch_peers` ends it when
    a process is lost, and at exit every process waits for the others (the chief's last writes; at most
    EXIT_WAIT_S s, or --peer-timeout if longer) before jax's own shutdown, which allows only --peer-timeout
    s. tensorflow: an all-reduce of a failure flag over every worker, which fails after --peer-timeout s
    (`CommunicationOptions`); the others learn that the chief failed, not why."""
    if backend == "jax":
        import atexit

        from jax._src import distributed

        client, forever = distributed.global_state.client, 24 * 3600 * 1000

        def at_exit():
            try:
                client.wait_at_barrier("project-exit", 1000 * max(timeout, EXIT_WAIT_S))
            except Exception:  # a process ended another way; jax's shutdown says so
                pass

        atexit.register(at_exit)
        PROCESS["wait"] = lambda: client.wait_at_barrier("project-failed", 1000 * timeout)
        return (lambda step, problem: client.key_value_set(f"project-chief-{step}", problem or "ok"),
                lambda step: (lambda value: "" if value == "ok" else value)(
                    client.blocking_key_value_get(f"project-chief-{step}", forever)))
    import tensorflow as tf

    strategy = setup.strategy

    def flag(failed):
        return float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(float(failed))), axis=None))

    PROCESS["wait"] = lambda: flag(True)
    return (lambda step, problem: flag(bool(problem)),
            lambda step: "it failed (its own output says why)" if flag(False) else "")


def peer_lost_message(who, timeout):
    return (f"process {process_index()}: {who} of the {process_count()} processes stopped answering for "
            f"{timeout} s (killed, crashed or unreachable); ending this one too. Restart every process with "
            f"--resume to go on from the last checkpoint")


def _exit_peer_lost(message):
    """Print the one line and end the process at once: a collective call that waits for the lost process
    may never return, and exit handlers could wait on it too."""
    print(message, file=sys.stderr, flush=True)
    os._exit(PEER_EXIT_CODE)


def _watch_peers(backend, setup, timeout):
    """A daemon thread that ends this process with one clear line when another process of the run is
    lost: jax, the coordination service's list of live processes (it drops a process whose heartbeats
    stop for `timeout` s); tensorflow, collective operations failing or timing out after `timeout` s
    (`CommunicationOptions`), which surface as exceptions in the main thread (`sys.excepthook`)."""
    if backend == "jax":
        import threading

        from jax._src import distributed

        client, everyone = distributed.global_state.client, list(range(process_count()))

        def watch():
            while True:
                time.sleep(min(5, timeout / 4))
                try:
                    live = client.get_live_nodes(everyone)
                except Exception as error:  # the coordinator itself is gone
                    _exit_peer_lost(peer_lost_message("process 0 (the coordinator)", timeout) + f" [{error}]")
                missing = sorted(set(everyone) - set(live))
                if missing:
                    _exit_peer_lost(peer_lost_message("process " + ", ".join(map(str, missing)), timeout))

        threading.Thread(target=watch, name="peer-watch", daemon=True).start()
    previous = sys.excepthook

    def hook(kind, error, traceback):
        if _is_peer_error(backend, error):
            others = [i for i in range(process_count()) if i != process_index()]
            who = f"process {others[0]}" if len(others) == 1 else "another process"
            _exit_peer_lost(peer_lost_message(who, timeout) + f" [{type(error).__name__}]")
        previous(kind, error, traceback)

    sys.excepthook = hook


def _is_peer_error(backend, error):
    """Whether an exception comes from a lost process (a failed or timed-out collective)."""
    if backend == "tensorflow":
        import tensorflow as tf

        return isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                                  tf.errors.CancelledError))
    text = str(error)
    return type(error).__name__ in ("XlaRuntimeError", "JaxRuntimeError") and any(
        word in text for word in ("gloo", "Gloo", "Connection", "heartbeat", "DEADLINE_EXCEEDED", "UNAVAILABLE"))


def _join_jax(timeout):
    """Join the processes that JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID describe
    (before jax starts its backend); CPU collectives across processes go through gloo."""
    import jax

    address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not address or jax.distributed.is_initialized():
        return
    try:
        count, index = int(os.environ["JAX_NUM_PROCESSES"]), int(os.environ["JAX_PROCESS_ID"])
    except (KeyError, ValueError):
        raise UsageError("JAX_COORDINATOR_ADDRESS is set: set JAX_NUM_PROCESSES (how many processes) and "
                         "JAX_PROCESS_ID (0 .. JAX_NUM_PROCESSES - 1) as integers too (docs/several-hosts.md)")
    if not 0 <= index < count:
        raise UsageError(f"JAX_PROCESS_ID {index} is outside 0 .. {count - 1} (JAX_NUM_PROCESSES {count})")
    if count == 1:
        return
    import threading

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    message = (f"process {index}: the {count} processes did not all join at {address} within --peer-timeout "
               f"{timeout} s; start every process with the same JAX_COORDINATOR_ADDRESS and JAX_NUM_PROCESSES "
               "and its own JAX_PROCESS_ID")
    # jax ends the process itself (a fatal log line and a stack dump) when its own initialization
    # timeout passes, so this timer, started first and shorter, gives the one line instead.
    timer = threading.Timer(timeout, _exit_peer_lost, [message])
    timer.daemon = True
    timer.start()
    try:
        jax.distributed.initialize(address, count, index, initialization_timeout=timeout + 30,
                                   heartbeat_timeout_seconds=timeout, shutdown_timeout_seconds=timeout)
    except Exception as error:  # e.g. the coordinator's port is taken
        _exit_peer_lost(f"{message} [{type(error).__name__}: {error}]")
    finally:
        timer.cancel()
    PROCESS.update(count=jax.process_count(), index=jax.process_index())
    from keras.src.backend.jax.distribution_lib import initialize_rng

    initialize_rng()  # as keras.distribution.initialize: one random seed for every process unless one is set


def _tf_cluster():
    return json.loads(os.environ.get("TF_CONFIG", "{}") or "{}")


def _tf_cluster_size():
    cluster = _tf_cluster().get("cluster", {})
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def _join_tensorflow():
    """Read this process's place from TF_CONFIG: the chief (or worker 0 when there is none) is process 0."""
    config = _tf_cluster()
    count = _tf_cluster_size()
    if count <= 1:
        return
    task = config.get("task", {})
    chiefs = len(config["cluster"].get("chief", []))
    kind, index = task.get("type"), task.get("index")
    if kind not in ("chief", "worker") or not isinstance(index, int):
        raise UsageError(f'TF_CONFIG names {count} processes but its "task" is {task!r}; give each process '
                         '{"type": "worker", "index": I} with I its place in the "worker" list (docs/several-hosts.md)')
    PROCESS.update(count=count, index=index if kind == "chief" else index + chiefs)


# --- backend-specific: process settings for speed ----------------------------------------------------

JAX_DROPOUT_RNG = "philox4x32"
RUNTIME = {}  # what tune_runtime() set, for config.json and the benchmark line


def tune_runtime():
    """Two process-wide settings that make the jax train step about 1.6x faster on CPU; the scripts
    call this once at start (training.run_script), the tests too. Returns what it set.

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
    """
    import ctypes
    import platform

    import keras

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
    return dict(RUNTIME)


def _check_several(args):
    if args.distribute == "none":
        raise UsageError(f"--distribute none trains in one process, but {process_count()} were started "
                         "(JAX_NUM_PROCESSES or TF_CONFIG); use --distribute auto or data, or start one process")


def _check_model_parallel(args, count):
    if args.model_parallel > count or count % args.model_parallel:
        raise UsageError(f"--model-parallel {args.model_parallel} asks for more devices than the {count} there are "
                         f"(or does not divide them); use a divisor of {count}, or --distribute data")


# --- backend-specific: jax ---------------------------------------------------------------------------

def _configure_jax(args):
    import jax
    import keras

    devices = jax.devices()  # every process's devices (configure() joined the processes first)
    mode = args.distribute
    if process_count() > 1:
        _check_several(args)
    if mode == "auto":
        mode = "data" if len(devices) > 1 else "none"
    if mode == "none":
        keras.distribution.set_distribution(None)
        return Setup("none", devices[:1], description=f"one device ({devices[0].platform})")
    if mode == "data":
        # Several processes: each feeds its own rows (Setup.shard, Setup.process_batches), so Keras must
        # not shard a tf.data input again.
        keras.distribution.set_distribution(keras.distribution.DataParallel(
            devices=devices, auto_shard_dataset=process_count() == 1))
        over = f" in {process_count()} processes" if process_count() > 1 else ""
        return Setup("data", devices, replicas=len(devices),
                     description=f"jax DataParallel over {len(devices)} {devices[0].platform} devices{over}")
    _check_model_parallel(args, len(devices))
    batch = len(devices) // args.model_parallel
    mesh = keras.distribution.DeviceMesh((batch, args.model_parallel), ("batch", "model"), devices=devices)
    layout = keras.distribution.LayoutMap(mesh)
    for pattern, axes in MODEL_PARALLEL_LAYOUT.items():
        layout[pattern] = axes
    keras.distribution.set_distribution(keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch"))
    return Setup("model", devices, replicas=batch,
                 description=f"jax ModelParallel: mesh batch {batch} x model {args.model_parallel}")


# --- backend-specific: tensorflow --------------------------------------------------------------------

def _configure_tensorflow(args):
    import tensorflow as tf

    if args.distribute == "model":
        raise UsageError("--distribute model is implemented for KERAS_BACKEND=jax; with tensorflow use "
                         "--distribute data")
    workers = process_count()
    if workers > 1:
        _check_several(args)
        # Created before anything starts tensorflow's runtime; collectives (ring all-reduce) time out
        # after --peer-timeout s instead of waiting forever.
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING,
            timeout_seconds=getattr(args, "peer_timeout", PEER_TIMEOUT_S))
        strategy = _tf_join_workers(options, workers)
        _patch_keras_multi_worker_reduce()
        description = f"tf MultiWorkerMirroredStrategy over {workers} workers"
        mine = strategy.extended.worker_devices  # this worker's; every worker has as many
        devices = [d.replace(f"task:{strategy.cluster_resolver.task_id}", f"task:{i}")
                   for i in range(workers) for d in mine]
        return Setup("data", devices, replicas=strategy.num_replicas_in_sync, strategy=strategy,
                     description=f"{description} ({strategy.num_replicas_in_sync} replicas)")
    gpus = tf.config.list_logical_devices("GPU")
    devices = gpus or tf.config.list_logical_devices("CPU")
    mode = args.distribute
    if mode == "auto":
        mode = "data" if len(devices) > 1 else "none"
    if mode == "none":
        return Setup("none", devices[:1], description=f"one device ({devices[0].name})")
    strategy = tf.distribute.MirroredStrategy([d.name for d in devices])
    description = f"tf MirroredStrategy over {len(devices)} devices"
    return Setup("data", devices, replicas=strategy.num_replicas_in_sync, strategy=strategy,
                 description=f"{description} ({strategy.num_replicas_in_sync} replicas)")


def _tf_join_workers(options, workers):
    """The MultiWorkerMirroredStrategy, and one all-reduce over every worker. A worker that never
    starts would keep the others waiting forever in the strategy's constructor, which holds the Python
    interpreter (no thread or signal handler of this process runs meanwhile), so a separate watchdog
    process prints the one line and ends this one (SIGKILL, exit status 137) after --peer-timeout s."""
    import subprocess

    import tensorflow as tf

    timeout = options.timeout_seconds
    message = (f"process {process_index()}: the {workers} workers of TF_CONFIG did not all start within "
               f"--peer-timeout {timeout} s; start one process for each worker, each with its own task index")
    watchdog = subprocess.Popen([sys.executable, "-c", "import os, signal, sys, time; time.sleep(float(sys.argv[1])); "
                                 "print(sys.argv[2], file=sys.stderr, flush=True); os.kill(int(sys.argv[3]), signal.SIGKILL)",
                                 str(timeout), message, str(os.getpid())])
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        joined = int(strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None))
    except Exception as error:
        _exit_peer_lost(f"{message} [{type(error).__name__}]")
    finally:
        watchdog.kill()
        watchdog.wait()
    if joined != strategy.num_replicas_in_sync:
        _exit_peer_lost(f"{message} [{joined} of {strategy.num_replicas_in_sync} replicas answered]")
    return strategy


def _patch_keras_multi_worker_reduce():
    """Keras 3.15's tensorflow train step averages each replica's results (loss, metrics: scalars)
    over a MultiWorkerMirroredStrategy with `strategy.reduce("MEAN", value, axis=0)`, which fails on a
    scalar ("Invalid reduction dimension 0 for input with 0 dimensions"), so no multi-worker step runs.
    Scalars are averaged over the replicas with axis=None instead; everything else as Keras does."""
    import tensorflow as tf
    from keras.src.backend.tensorflow import trainer

    original = trainer.reduce_per_replica
    if getattr(original, "patched", False):
        return

    def reduce_per_replica(values, strategy, reduction):
        import keras

        if reduction in ("auto", "mean") and trainer._collective_all_reduce_multi_worker(strategy):
            def mean(v):
                one = v.values[0] if trainer._is_per_replica_instance(v) else v  # one replica per worker: a tensor
                if getattr(one, "shape", None) is not None and one.shape.rank == 0:
                    return strategy.reduce("MEAN", v, axis=None)
                return original(v, strategy, reduction)

            return keras.tree.map_structure(mean, values)
        return original(values, strategy, reduction)

    reduce_per_replica.patched = True
    trainer.reduce_per_replica = reduce_per_replica


def _tf_split(strategy, batch, replicas):
    """Per-replica slices of a padded global batch, as tf.distribute DistributedValues."""
    import tensorflow as tf

    import keras

    def slice_for(context):
        i = context.replica_id_in_sync_group
        rows = keras.tree.flatten(batch)[0].shape[0] // replicas
        return keras.tree.map_structure(lambda a: tf.constant(a[i * rows:(i + 1) * rows]), batch)

    return strategy.experimental_distribute_values_from_function(slice_for)


def compile_xla(setup):
    """Whether the train step uses XLA (Keras's jit_compile).

    jax: always (jax.jit is XLA). torch: never (eager). tensorflow: on GPUs only. On CPU, graph mode
    with oneDNN kernels trained faster than XLA here (`train_nmt.py --benchmark`: 628-640 against
    550-569 target tokens/s; results/speed/README.md), and bfloat16 matrix products run
    at twice the float32 rate only through oneDNN; XLA also cannot place the mirrored variables of a
    tf.distribute strategy over CPU devices. (Decoding steps keep XLA on CPU: `training.compiled`.)
    """
    import keras

    backend = keras.backend.backend()
    if backend == "torch":
        return False
    if backend == "tensorflow":
        return bool(setup.devices) and all("GPU" in getattr(d, "name", d) for d in setup.devices)
    return True


# --- backend-specific: torch -------------------------------------------------------------------------

def _configure_torch(args):
    import torch

    cuda = torch.cuda.device_count()
    if args.distribute in ("data", "model"):
        raise UsageError(f"--distribute {args.distribute}: KERAS_BACKEND=torch trains on one device here; "
                         "use KERAS_BACKEND=jax (data or model) or tensorflow (data) to use several")
    device = "cuda" if cuda else "cpu"
    note = f" ({cuda} GPUs seen; jax or tensorflow use them all)" if cuda > 1 else ""
    return Setup("none", [device], description=f"one device ({device}){note}")
