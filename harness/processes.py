"""Several processes training as one (docs/several-hosts.md): joining them, which one writes, losing one.

    join(backend, timeout); start(backend, setup, timeout)  # devices.configure: several processes as one
    vocab = chief_first(lambda: learn_vocabulary(...))       # the chief writes it, then the others read it

`devices.configure` joins the processes (`_join_jax`, `_join_tensorflow`) before it sets up the
devices, and then starts `_watch_peers`: a process that dies makes the others exit within
`--peer-timeout` seconds with one line naming it (exit code 3, `PEER_EXIT_CODE`) instead of waiting for
it forever. Each process reads the whole global batch and feeds its own rows (`devices.Setup.feed`).
The chief alone writes checkpoints, metrics and config.json: harness/rundir.py's writers do nothing on the
others, whose standard output goes to /dev/null (`_quiet_stdout`).

Which process writes is harness/files.py's (`is_chief`), which `join` sets. No Keras here; the backends' own
libraries are imported inside the functions that join and watch the processes (backend-specific code).
"""

import atexit
import json
import os
import subprocess
import sys
import threading
import time

from harness import private_api
from harness.files import PROCESS, is_chief, process_count, process_index
from harness.console import UsageError

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
