"""Writing files without Keras: atomically, as JSON or CSV, into a directory checked first; and several
processes training as one, of which the chief alone writes (the section at the end).

    prepare_out_dir("runs/sweep")                      # created and writable, or a UsageError naming it
    write_json("runs/sweep/summary.json", table)        # never half-written (write_atomic)
    write_csv(path, rows); rows = read_csv(path)
    lines = read_lines("data/multi30k/train.de.gz")      # a text file's lines, or a DataError saying why not

A write that fails for want of space (or any other OSError) raises `console.WriteError`: one line saying
what could not be written where, and that `--resume` goes on once there is room (exit code 4). Only the
chief of several processes writes (`chief.is_chief`); on the others these functions do nothing.
The files of a training run, and what they mean, belong to `rundir.RunDir`.
"""

import atexit
import bz2
import csv
import fcntl
import gzip
import io
import json
import math
import os
import subprocess
import sys
import threading
import time

import numpy as np

from harness import private_api
from harness.console import DataError, UsageError, WriteError


# --- which process of a run this is: process 0, the chief, alone writes the run's files ----------------
# One process unless several train as one (harness/files.py joins them and sets `PROCESS`).

PROCESS = dict(count=1, index=0)  # set when files.join() joins several processes


def process_count():
    """How many processes train together (1 unless JAX_* variables or TF_CONFIG name several)."""
    return PROCESS["count"]


def process_index():
    """This process's place among them, 0 .. process_count() - 1."""
    return PROCESS["index"]


def is_chief():
    """Whether this process writes the run's files (checkpoints, metrics, config.json): process 0."""
    return PROCESS["index"] == 0


def write_atomic(path, data):
    """Write bytes or text to `path` through a temporary file and a rename: never half-written."""
    if not is_chief():
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with writing(path, tmp):
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)


class writing:
    """`with writing(path, tmp): ...` turns an OSError of the block into a WriteError naming `path`,
    after removing the temporary file `tmp` (a partial write) if there is one."""

    def __init__(self, path, tmp=None):
        self.path, self.tmp = path, tmp

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None or not isinstance(error, OSError):
            return False
        if self.tmp and os.path.exists(self.tmp):
            try:
                os.remove(self.tmp)
            except OSError:
                pass
        raise WriteError(f"cannot write {self.path} ({error.strerror or error})") from None


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
    """Create `path`, check it can be written and hold its lock (`lock_run_dir`), or raise UsageError naming
    it (the chief alone)."""
    if not is_chief():
        return path
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-test{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as error:
        raise UsageError(f"{flag} {path}: cannot write there "
                         f"({'a file, not a directory' if os.path.isfile(path) else error.strerror or error}); "
                         "choose another directory")
    lock_run_dir(path)  # before anything is written there: one writer per folder
    return path


# --- reading text ------------------------------------------------------------------------------------

BOM = "\ufeff"  # the UTF-8 byte-order mark (EF BB BF) some editors write at the start of a text file


def read_lines(path):
    """Lines of a UTF-8 text file (gzip- or bzip2-compressed if its name ends in .gz or .bz2) without
    trailing newlines; trailing blank lines dropped. Files saved on Windows read the same: a byte-order mark
    at the start of the file and the CR of CRLF line endings are dropped."""
    if not os.path.exists(path):
        raise DataError(f"{path}: file not found; pass --data-dir with {{train,valid,test}}.{{src,tgt}} files")
    if os.path.isdir(path):
        raise DataError(f"{path}: is a directory, expected a text file with one sentence a line")
    try:
        opener = gzip.open if path.endswith(".gz") else bz2.open if path.endswith(".bz2") else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as error:  # truncated, or not compressed as its name says
        raise DataError(f"{path}: cannot be decompressed ({error}); the file is damaged: restore it "
                        "(e.g. git checkout -- data/)") from None
    if b"\0" in raw:
        raise DataError(f"{path}: looks binary (contains NUL bytes); expected UTF-8 text, one sentence a line")
    try:  # the whole file at once (a newline byte is never part of a longer UTF-8 character)
        decoded = [line.rstrip("\r") for line in raw.decode("utf-8").removeprefix(BOM).split("\n")]
    except UnicodeDecodeError as error:  # its line, and its byte within that line
        raise DataError("%s: line %d is not valid UTF-8 (%s at byte %d); convert the file to UTF-8, e.g. with iconv" % (
            path, raw.count(b"\n", 0, error.start) + 1, error.reason, error.start - raw.rfind(b"\n", 0, error.start) - 1)) from None
    while decoded and not decoded[-1].strip():
        decoded.pop()
    return decoded


def read_parallel(data_dir, split, src="de", tgt="en"):
    """(source, target) sentence pairs of `split` from `data_dir/split.src` and `data_dir/split.tgt`."""
    src_path, tgt_path = (os.path.join(data_dir, f"{split}.{lang}") for lang in (src, tgt))
    source, target = read_lines(src_path), read_lines(tgt_path)
    if len(source) != len(target):
        raise DataError(f"{src_path} has {len(source)} lines but {tgt_path} has {len(target)}; "
                        "the two sides of a parallel corpus must have one sentence a line, aligned")
    if not source:
        raise DataError(f"{src_path} and {tgt_path} are empty; the {split} split needs sentence pairs")
    return list(zip(source, target))


def parallel_splits(data_dir, src, tgt, splits=("train", "valid", "test")):
    """{split: `read_parallel`} of a --data-dir, refused (DataError, one line) where its paths or its files
    are not a parallel corpus: it needs no backend, so the scripts read it before the backend's import."""
    check_parallel_dir(data_dir, src, tgt, splits)
    return {split: read_parallel(data_dir, split, src, tgt) for split in splits}


def check_parallel_dir(data_dir, src, tgt, splits=("train", "valid", "test")):
    """Refuse (DataError, one line) a --data-dir that is not a folder of the fairseq layout, `split.src` and
    `split.tgt` for each split, before anything is read: it reads only paths, so it needs no backend."""
    if not os.path.isdir(data_dir):
        raise DataError(f"--data-dir {data_dir}: not a directory; it should hold {{train,valid,test}}.{{{src},{tgt}}}")
    for path in (os.path.join(data_dir, f"{split}.{lang}") for split in splits for lang in (src, tgt)):
        if not os.path.isfile(path):
            raise DataError(f"{path}: {'is a directory' if os.path.isdir(path) else 'file not found'}; pass "
                            f"--data-dir with {{train,valid,test}}.{{{src},{tgt}}} files")


# A training run's state.json (what `rundir.RunDir` writes after each checkpoint and reads on --resume) and
# config.json (its settings): their names are here so that the command lines, which load no Keras, can tell
# a directory that holds a run.
STATE = "state.json"
CONFIG = "config.json"


LOCK = ".lock"  # held by the one process that writes a run folder (`lock_run_dir`)
_LOCKS = {}  # the run folders this process holds: {real path: the open lock file}


def lock_run_dir(path):
    """Hold `path`/.lock (fcntl.flock) until this process ends, or refuse, with one line naming the other
    process, a folder that another live process holds: one writer per run folder. The lock goes when its
    process dies, however it ends. Taken again by the same process, it is already held (the chief alone)."""
    key = os.path.realpath(path)
    if not is_chief() or key in _LOCKS:
        return
    lock = open(os.path.join(path, LOCK), "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: the holder wrote its process id there
        raise UsageError(f"{path} is in use by another run (process {open(lock.name).read().strip() or '?'}); wait "
                         "for it to end, or stop it and continue it with --resume, or choose another --out") from None
    lock.truncate(0)
    lock.write(str(os.getpid()))
    lock.flush()
    _LOCKS[key] = lock


def unlock_run_dirs():
    """Let go of every run folder this process holds (`lock_run_dir`): its run has ended."""
    while _LOCKS:
        _LOCKS.popitem()[1].close()


def drop_lock_file(path):
    """Remove `path`/.lock if this process holds it (`lock_run_dir`), and let go of it: a folder that was
    empty is given back as it was. A lock file that another process holds stays: it is that run's."""
    lock = _LOCKS.pop(os.path.realpath(path), None)
    if lock is not None:
        os.remove(lock.name)  # unlinked while held: no other process can take the old file in between
        lock.close()


def holds_run(path):
    """Whether the directory `path` holds a run that --resume can go on with."""
    return os.path.exists(os.path.join(path, STATE))


def check_run_path(path, flag):
    """Refuse a `flag` PATH (train_nmt.py's --translate and --eval-only) that is neither a checkpoint file nor a
    run directory of train_nmt.py (one holding config.json): before the backend's import, as every refusal."""
    if not os.path.exists(path):
        raise UsageError(f"{flag} {path}: file not found; pass a .keras file that a run wrote (runs/NAME/checkpoints/) "
                         "or a run directory (runs/NAME)")
    if os.path.isdir(path) and not os.path.isfile(os.path.join(path, CONFIG)):
        raise UsageError(f"{flag} {path}: not a run of train_nmt.py (no config.json); pass a run directory "
                         "(runs/NAME) or a checkpoint inside one (runs/NAME/checkpoints/epochN.keras)")


def is_finite(value):
    return value is not None and math.isfinite(float(value))


# --- checkpoints: what rundir.py saves into each .keras archive beside Keras's own, and callbacks.py restores

RANDOM_STATE = "random_state.json"  # an entry of each .keras checkpoint: what draws the dropout masks


def seed_generators(model):
    """The variables of `model`'s random generators, in its variable order: each Dropout's SeedGenerator state
    [seed, draws so far], the variables a model holds beyond its weights. Keras's .keras format does not
    save them, so a model loaded from a checkpoint would start its generators again."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.non_trainable_variables if id(v) not in weights]


# --- several processes training as one: joining them, which one writes, losing one --------------------------
# docs/several-hosts.md says how to start them.
#
#     join(backend, timeout); start(backend, setup, timeout)  # devices.configure: several processes as one
#     vocab = chief_first(lambda: learn_vocabulary(...))       # the chief writes it, then the others read it
#
# `devices.configure` joins the processes (`_join_jax`, `_join_tensorflow`) before it sets up the
# devices, and then starts `_watch_peers`: a process that dies makes the others exit within
# `--peer-timeout` seconds with one line naming it (exit code 3, `PEER_EXIT_CODE`) instead of waiting for
# it forever. Each process reads the whole global batch and feeds its own rows (`devices.Setup.feed`).
# The chief alone writes checkpoints, metrics and config.json: harness/rundir.py's writers do nothing on the
# others, whose standard output goes to /dev/null (`_quiet_stdout`).
#
# Which process writes is `is_chief`'s (above), which `join` sets. No Keras here; the backends' own libraries
# are imported inside the functions that join and watch the processes (backend-specific code).

PEER_EXIT_CODE = 3  # a process of the run died or stopped answering; 2 stays "bad input"
EXIT_WAIT_S = 300  # jax: how long a process that is done waits at exit for the others to be done too


def several_named():
    """Whether the environment names several processes to train as one (JAX_* variables, TF_CONFIG), known
    before `join` joins them."""
    return bool(os.environ.get("JAX_COORDINATOR_ADDRESS")) or _tf_cluster_size() > 1


def join(backend, timeout):
    """Join the processes that the environment names (JAX_* variables, TF_CONFIG), before any device is
    set up; one process: nothing to do. torch has no path for several processes here."""
    if backend == "jax":
        _join_jax(timeout)
    elif backend == "tensorflow":
        _join_tensorflow()
    elif os.environ.get("JAX_COORDINATOR_ADDRESS") or _tf_cluster_size() > 1:
        raise UsageError("several processes (JAX_COORDINATOR_ADDRESS or TF_CONFIG set) need KERAS_BACKEND=jax or "
                         "tensorflow; KERAS_BACKEND=torch trains in one process here")


def start(backend, setup, timeout):
    """Once the devices are set up (`setup`, a devices.Setup): watch the other processes, open the
    chief's messages (`chief_first`), and quiet the standard output of all but the chief."""
    if PROCESS["count"] == 1:
        return
    _watch_peers(backend, setup, timeout)
    PROCESS["tell"], PROCESS["hear"] = _chief_messages(backend, setup, timeout)
    if not is_chief():  # the chief speaks for the run; errors and warnings still go to standard error
        _quiet_stdout()


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
    created (`cli.run_script`): the others may still be reading the vocabulary there."""
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
        client, forever = private_api.jax_coordination_client(), 24 * 3600 * 1000

        def at_exit():
            PROCESS["closing"] = True  # this process's work is done: the watch stands down (see watch)
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
        client, everyone = private_api.jax_coordination_client(), list(range(process_count()))

        def watch():
            # Once this process is exiting, the others exit too and the coordinator (process 0) may
            # close before this process has: that is the end of the run, not a lost process.
            lost = None
            while not lost:
                time.sleep(min(5, timeout / 4))
                try:
                    missing = sorted(set(everyone) - set(client.get_live_nodes(everyone)))
                    lost = missing and peer_lost_message("process " + ", ".join(map(str, missing)), timeout)
                except Exception as error:  # the coordinator itself is gone
                    lost = peer_lost_message("process 0 (the coordinator)", timeout) + f" [{error}]"
            if not PROCESS.get("closing"):  # read after the check, which may have waited on a closing run
                _exit_peer_lost(lost)

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
    """Whether an exception comes from a lost process (a failed or timed-out collective). jax raises
    them under several classes (XlaRuntimeError, JaxRuntimeError, and ValueError for a gloo
    "Connection reset by peer"), so its check reads the messages along the exception's chain."""
    if backend == "tensorflow":
        import tensorflow as tf

        return isinstance(error, (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                                  tf.errors.CancelledError))
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if any(word in str(error) for word in PEER_ERROR_WORDS):
            return True
        error = error.__cause__ or error.__context__
    return False


PEER_ERROR_WORDS = ("gloo", "Gloo", "Connection reset", "Connection refused", "heartbeat", "DEADLINE_EXCEEDED",
                    "UNAVAILABLE", "coordination service")


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
    private_api.keras_jax_initialize_rng()  # one random seed for every process unless one is set


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


def tf_join_workers(options, workers):
    """The MultiWorkerMirroredStrategy, and one all-reduce over every worker. A worker that never
    starts would keep the others waiting forever in the strategy's constructor, which holds the Python
    interpreter (no thread or signal handler of this process runs meanwhile), so a separate watchdog
    process prints the one line and ends this one (SIGKILL, exit status 137) after --peer-timeout s."""
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
