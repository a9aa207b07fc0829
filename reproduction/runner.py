"""The runs on Ray (docs/reproduce.md says why Ray core tasks): each run is one Ray task that starts the
run's own process, on a node whose free resources fit it. Without an address, a local Ray instance sized
to this machine; with one (`--address HOST:PORT`, or RAY_ADDRESS), a running cluster. Without Keras.

    engine = Engine()                                  # or Engine("head:6379"): a running cluster
    handle = engine.submit(task)                       # starts where `task.cpus` and `task.gpus` fit
    for handle, outcome in engine.wait([handle]): ...  # as runs end: exit code, seconds, where it ran
    engine.close()
    drive(engine, waiting, slots, take)                # the one loop: reproduce.py's stages, a script's sweep,
                                                       # the numerics check's steps (on `Threads`)
    run_tasks(tasks, jobs=2)                           # a static list with dependencies: scripts' --sweep

Ray places each run, queues the rest, runs a task again elsewhere when its node is lost (`RETRIES`) and
stops every run with the driver; a run goes on from its last checkpoint when it starts again (`Task.resume`)
and records where it ran (RUN/placement.json).
"""

import concurrent.futures
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from harness.console import UsageError
from harness.rundir import LOG, RunDir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RETRIES = 3  # a run whose node is lost starts again elsewhere, from its last checkpoint, this many times
GPU_MEMORY = 0.9  # of a run's share of one GPU, what jax may take (XLA_PYTHON_CLIENT_MEM_FRACTION)
OBJECT_STORE = 100 * 2 ** 20  # bytes: a local instance passes only small outcomes (Ray's default: 30 % of memory)
SHIPPED = dict(excludes=["/runs/", "/.git/", "/.venv/", "__pycache__/", "/results/certify/"])  # code to a cluster


def thread_env(jobs, threads=None):
    """Environment variables that give each of `jobs` processes side by side cores / jobs kernel threads
    (or `threads` each): OpenMP's (torch), TensorFlow's and XLA's Eigen pool (jax; one thread turns the pool
    off). XLA_FLAGS keeps what it held before (only `--flag=value` words: XLA stops at any other)."""
    threads = str(threads or max(1, (os.cpu_count() or 1) // jobs))
    xla = f"--xla_cpu_multi_thread_eigen={'true' if threads != '1' else 'false'}"
    return dict(OMP_NUM_THREADS=threads, TF_NUM_INTRAOP_THREADS=threads, TF_NUM_INTEROP_THREADS="1",
                XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS"), xla])))


@dataclass(frozen=True)
class Task:
    """One run: `command`, its argv after the node's Python interpreter, run in the repository, writes
    `run_dir`/results.json; `resume`, if given, is the argv where `run_dir` already holds a run. It starts
    once the tasks named in `after` have ended well, with `threads` kernel threads on as many CPUs, a share
    `gpus` of one GPU where the cluster has GPUs, and the environment variables `env` ((name, value) pairs)."""

    name: str
    run_dir: str
    command: tuple
    after: frozenset = field(default_factory=frozenset)
    env: tuple = ()
    resume: tuple = ()
    threads: int = 1
    gpus: float = 0.0


def run_env(task, gpu_ids=()):
    """The environment of a task's process: this one's, the task's own, its threads, the repository on
    PYTHONPATH; on a GPU, jax preallocates only its share of the memory (by default 75 % of every GPU it sees)
    and TensorFlow grows into what it uses."""
    env = dict(os.environ, **dict(task.env), **thread_env(1, task.threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    if gpu_ids:
        env.update(XLA_PYTHON_CLIENT_PREALLOCATE="true", TF_FORCE_GPU_ALLOW_GROWTH="true",
                   XLA_PYTHON_CLIENT_MEM_FRACTION=f"{GPU_MEMORY * min(1.0, task.gpus):.3f}")
    return env


def run_one(task, live=False, cwd=None):
    """Run `task`'s process on this node (in a Ray worker), in `cwd` (default: the repository), its output to
    RUN/train.log (or, `live`, here), going on from the run's checkpoint where it holds one; returns
    {code, seconds, resumed, placement}."""
    import ray  # Ray is imported where it is used: a script that starts no run (--help, one run) never loads it

    run_dir = RunDir(task.run_dir)
    resumed = bool(task.resume) and run_dir.holds_run()
    gpu_ids = [str(gpu) for gpu in ray.get_gpu_ids()]
    placement = dict(node=ray.get_runtime_context().get_node_id(), host=socket.gethostname(), gpus=gpu_ids,
                     started=round(time.time(), 1), resumed=resumed, nice=os.nice(0))
    os.makedirs(task.run_dir, exist_ok=True)
    run_dir.add_placement(placement)
    argv = [sys.executable, *(task.resume if resumed else task.command)]
    start = time.time()
    with run_dir.log() if not live else contextlib.nullcontext() as log:
        # read through its own handle: a run refused at its start removes its folder, train.log with it
        with open(run_dir.file(LOG), "rb") if log else contextlib.nullcontext() as reader:
            code = subprocess.run(argv, env=run_env(task, gpu_ids), cwd=cwd or ROOT, stdout=log,
                                  stderr=subprocess.STDOUT if log else None).returncode
            gone = reader is not None and code != 0 and not os.path.exists(run_dir.file(LOG))
            said = last_line(reader.read()) if gone else None
    save_coverage()
    return dict(code=code, seconds=time.time() - start, resumed=resumed, placement=placement,
                **({"said": said} if said else {}))


def last_line(output):
    """The last line a process wrote (bytes), as text: what a run refused at its start said."""
    lines = [line.strip() for line in output.decode("utf-8", "replace").splitlines() if line.strip()]
    return lines[-1] if lines else None


def save_coverage():
    """Under coverage.py (the numerics check, reproduction/certify.py), save what this process ran so far: Ray ends
    its worker processes without their exit handlers, where coverage.py would save."""
    measuring = sys.modules.get("coverage")
    current = measuring.Coverage.current() if measuring else None
    if current is not None:
        current.save()


class Engine:
    """A Ray instance: a new local one of `cpus` CPUs (by default all, at least 2: the most threads a run of the
    Results table had), or the running cluster at `address` (or RAY_ADDRESS), which receives the
    repository's code (`SHIPPED`) and whose nodes must share the run folders (`check_shared`)."""

    def __init__(self, address=None, cpus=None, live=False):
        import ray  # as in run_one

        address = address or os.environ.get("RAY_ADDRESS") or None
        why = address and unreachable(address)
        if why:  # Ray itself would wait for minutes
            raise UsageError(f"--address {address}: no Ray cluster answers there ({why}); start one (ray start --head) "
                             "or leave out --address for a local one")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # A local instance's workers, and the runs they start, at this process's priority: Ray adds 15 to it by
        # default, which starves a run beside any other work, a test suite or a second reproduction (a cluster:
        # set it on `ray start`)
        os.environ.setdefault("RAY_worker_niceness", "0")
        try:
            ray.init(address=address or "local", num_cpus=None if address else (cpus or max(2, os.cpu_count() or 1)),
                     object_store_memory=None if address else OBJECT_STORE, include_dashboard=False, log_to_driver=live, logging_level=logging.ERROR,
                     configure_logging=True, runtime_env=dict(working_dir=ROOT, **SHIPPED) if address else None)
        except (ConnectionError, RuntimeError, ValueError) as error:
            raise UsageError(f"--address {address}: no Ray cluster reached there ({str(error).splitlines()[0]}); "
                             "start one (ray start --head) or leave out --address for a local one") from None
        self.ray, self.address, self.live = ray, address, live
        self.remote = ray.remote(run_one)

    def resources(self):
        """(CPUs, GPUs, nodes alive) of the instance."""
        total = self.ray.cluster_resources()
        nodes = [node for node in self.ray.nodes() if node.get("Alive")]
        return int(total.get("CPU", 0)), float(total.get("GPU", 0)), nodes

    def slots(self, threads=1, gpus=0.0):
        """How many runs of `threads` CPUs (and `gpus` of a GPU each, where there are GPUs) fit at once."""
        cpus, gpu_count, _ = self.resources()
        fit = max(1, cpus // max(1, threads))
        return min(fit, max(1, int(gpu_count / gpus + 1e-9))) if gpus and gpu_count else fit

    def submit(self, task):
        """Start `task` as a Ray task where its resources fit (queued until they do), spread over a cluster's
    nodes; returns its handle. Refuses, in one line, a run that no node has the CPUs for."""
        _, gpus, nodes = self.resources()  # one question to the cluster a run
        largest = max((node["Resources"].get("CPU", 0) for node in nodes), default=0)
        if task.threads > largest:
            raise UsageError(f"{task.name} takes {task.threads} CPUs (the kernel threads its results were measured "
                             f"with), and no node of the Ray instance has more than {largest:g}; add a node with "
                             f"{task.threads} CPUs")
        return self.remote.options(num_cpus=task.threads, num_gpus=task.gpus if gpus else 0,
                                   max_retries=RETRIES, retry_exceptions=False, name=task.name,
                                   scheduling_strategy="SPREAD" if self.address else "DEFAULT",
                                   ).remote(task, self.live, None if self.address else os.getcwd())

    def wait(self, handles):
        """[(handle, outcome)] of the runs among `handles` that have ended, once one has; a task that itself
    failed (its node lost more than RETRIES times) has code None and `error`."""
        done, _ = self.ray.wait(list(handles), num_returns=1)
        ended = []
        for handle in done:
            try:
                ended.append((handle, self.ray.get(handle)))
            except self.ray.exceptions.RayError as error:
                ended.append((handle, dict(code=None, error=str(error).splitlines()[0], resumed=True)))
        return ended

    def announce(self, task):
        announce(task, self.live)

    def check_shared(self, folder):
        """Refuse, in one line, a cluster whose nodes do not all see and write `folder`."""
        if not self.address:
            return
        mark = os.path.join(folder, f".seen-{os.getpid()}")
        with open(mark, "w") as f:
            f.write("seen")
        probe = self.ray.remote(_sees)
        try:
            for node in self.resources()[2]:
                strategy = self.ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
                why = self.ray.get(probe.options(num_cpus=0, scheduling_strategy=strategy).remote(mark))
                if why:
                    raise UsageError(f"--runs-dir {folder}: node {node.get('NodeManagerHostname', node['NodeID'])} "
                                     f"{why}; pass a folder every node shares (a shared filesystem, at the same path)")
        finally:
            os.remove(mark)

    def close(self):
        self.ray.shutdown()


def unreachable(address, timeout=5.0):
    """Why nothing answers at HOST:PORT (one phrase), or None; other forms of address are left to Ray."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in host:
        return None
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__
    return None


def _sees(mark):
    """On one node: why it cannot use the folder of the file `mark` (None if it reads it and writes beside it)."""
    try:
        with open(mark) as f:
            if f.read() != "seen":
                return "sees another folder at that path"
        probe = f"{mark}-{socket.gethostname()}-{os.getpid()}"
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as error:
        return f"cannot use it ({error.strerror or error})"
    return None


@contextlib.contextmanager
def stop_on_sigterm():
    """Make SIGTERM (`kill PID`) end this driver as Ctrl-C does: closing the engine stops every run."""
    if sys.platform == "win32":
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def drive(engine, waiting, slots, take, started=None, late=None):
    """The one loop over `engine`, for a script's sweep and for reproduce.py alike: start the tasks that
    `waiting(running, failed)` lists, as `startable` allows (it is asked again after each run ends, so a
    protocol's later stages join), at most `slots(task)` runs at a time, calling `started(task)` as each starts;
    `take(task, outcome)` takes in each run that ends and returns why it failed, or None. With `late(task)`, a
    task expected to end too late is held back. Returns ({name: why it failed}, {names held back})."""
    failed, running, held = {}, {}, set()  # running: {handle: task}
    while True:
        ready = startable(waiting(running, failed), running, failed, late, held)
        for task in ready[:max(0, slots(ready[0]) - len(running))] if ready else ():
            engine.announce(task)
            if started:
                started(task)
            running[engine.submit(task)] = task
        if not running:
            return failed, held
        for handle, outcome in engine.wait(running):
            task = running.pop(handle)
            why = take(task, outcome)
            if why is not None:
                failed[task.name] = why


class Threads:
    """An engine of threads in this process instead of Ray, `slots` tasks at a time: `run(task)` on a thread of
    its own, whose return value is the task's outcome (an exception it raises comes out of `wait`). The
    numerics check's steps run on it (each a process of its own: reproduction/certify.py), and the tests'
    stand-in for Ray."""

    def __init__(self, run, slots=2):
        self.run, self.count = run, slots
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=slots)

    def slots(self, threads=1, gpus=0.0):
        return self.count

    def announce(self, task):
        """Nothing: whoever runs the tasks says what they did."""

    def submit(self, task):
        return self.pool.submit(self.run, task)

    def wait(self, handles):
        done, _ = concurrent.futures.wait(handles, return_when=concurrent.futures.FIRST_COMPLETED)
        return [(handle, handle.result()) for handle in done]

    def close(self):
        self.pool.shutdown()


def run_tasks(tasks, jobs, live=False, address=None):
    """Run `tasks` (a script's --sweep) on a Ray instance, `jobs` at a time, in order as far as their `after`
    allow; returns {name: results.json}. A run that fails (an error, or no results.json) fails those after
    it; the others go on, and the failed are named together in one UsageError."""
    results = {}

    def take(task, outcome):
        result = ended(task, outcome, live)
        if result is None:
            return why_failed(task, outcome, live)
        results[task.name] = result
        return None

    engine = Engine(address, cpus=None, live=live)
    try:
        failed, _ = drive(engine, lambda running, failed: [
            task for task in tasks if task.name not in results and task.name not in failed
            and task not in running.values()], lambda task: jobs, take)
    finally:
        engine.close()
    refuse_failed(failed)
    return results


def startable(tasks, running, failed, late=None, held=None):
    """The `tasks` that may start now: none after a task not ended (one after a failed task fails too, into
    `failed`), nor, with `late(task)`, one expected to end too late: those go into `held`."""
    unended = {task.name for task in tasks} | {task.name for task in running.values()}
    for task in tasks:
        if task.after & set(failed):
            failed[task.name] = f"not started: {', '.join(sorted(task.after & set(failed)))} failed"
    ready = [task for task in tasks if task.name not in failed and not task.after & unended]
    if late:
        held |= {task.name for task in ready if late(task)}
    return [task for task in ready if task.name not in (held or ())]


def refuse_failed(failed):
    """One UsageError naming every failed run ({name: why}), if any."""
    if failed:
        named = ", ".join(f"{name} ({why})" for name, why in failed.items())
        raise UsageError(f"runs failed: {named}; fix the cause and run the same command again (finished runs are kept)")


def announce(task, live=False):
    print(f"== {task.name}: started ({task.threads} thread{'s' if task.threads != 1 else ''}"
          + ("" if live else f"; log {task.run_dir}/train.log") + ")", flush=True)


def ended(task, outcome, live=False):
    """The run's results.json once its task has ended well (printed in one line), else None."""
    run_dir = RunDir(task.run_dir)
    result = run_dir.results() if outcome.get("code") == 0 else None
    if result is not None:
        translation = "outcome" in result and "final_valid_accuracy" not in result
        starts = run_dir.placements()  # where it ran: the last start's host
        print(f"== {task.name}: {result.get('outcome', 'done')}"
              + (f", test BLEU {result.get('test_bleu', '-')}" if translation else "")
              + (f" (on {starts[-1]['host']})" if starts else ""), flush=True)
    return result


def why_failed(task, outcome, live=False):
    if outcome.get("code") is None:
        return outcome.get("error", "its task failed")
    if outcome.get("said"):  # its folder, train.log with it, is gone
        return f"exit code {outcome['code']}: {outcome['said']}"
    return f"exit code {outcome['code']}" + ("" if live else f"; see {task.run_dir}/train.log")
