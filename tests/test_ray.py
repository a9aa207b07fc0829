"""The runs on a real Ray engine (reproduction/runner.py): a local instance runs a list of runs with
dependencies; a cluster of a head and two more nodes, each a `ray start` process of its own on this
machine, runs reproduce.py --smoke over both nodes; a run whose node is killed finishes on the other with
the numbers of a run never interrupted; a killed driver's runs stop, and the same command goes on without
redoing finished runs. The same on every backend (each run chooses its own): run once, under torch, whose
process has the fewest tests of its own (tests/run_all_backends.py)."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import psutil
import pytest
from conftest import once, wait_for, write_corpus

from reproduction import runner
from harness import synthetic
from harness.console import UsageError
from harness.rundir import RunDir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ray_once = once("runs on Ray", backend="torch")
RAY = os.path.join(os.path.dirname(sys.executable), "ray")
# a cluster on loopback, for these tests alone: no token between its processes
CLUSTER_ENV = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")


STAND_IN_RUN = """import json, os, sys, time
run_dir, outcome = sys.argv[1:]
start = time.time()
print("threads", os.environ["OMP_NUM_THREADS"], flush=True)
time.sleep(3)
if outcome == "crash":
    sys.exit("crashed")
if outcome == "refused":  # as a script refusing its settings: one line, and nothing of its folder left
    import shutil
    shutil.rmtree(run_dir)
    sys.exit("stand_in.py: error: --lr inf: not a finite number")
if outcome != "no-results":
    json.dump(dict(outcome=outcome, start=start, end=time.time()), open(os.path.join(run_dir, "results.json"), "w"))
"""


@ray_once
def test_run_tasks_runs_jobs_at_a_time_and_names_the_failed_runs(tmp_path, capsys):
    """A local Ray instance with a stand-in for train_nmt.py: runs started in the list's order, `jobs` of
    them at a time, each one's output in RUN/train.log with its threads; failed runs do not stop the others
    and are named together; a run after a failed one does not start."""
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN_RUN)

    def tasks(outcomes, after=()):
        return [runner.Task(name, str(tmp_path / name), (str(script), str(tmp_path / name), outcome),
                            frozenset(after if name == "later" else ())) for name, outcome in outcomes]

    results = runner.run_tasks(tasks([("a", "finished"), ("b", "finished"), ("c", "diverged")]), 2)
    assert sorted(results) == ["a", "b", "c"] and results["c"]["outcome"] == "diverged"
    assert list(results)[-1] == "c"  # in the order the runs ended
    first_end = min(results["a"]["end"], results["b"]["end"])
    assert results["a"]["start"] < first_end and results["b"]["start"] < first_end <= results["c"]["start"]
    printed = capsys.readouterr().out
    assert printed.index("== a: started") < printed.index("== b: started") < printed.index("== c: started")
    assert printed.count("started (1 thread;") == 3 and "== c: diverged, test BLEU -" in printed
    assert (tmp_path / "a" / "train.log").read_text() == "threads 1\n"
    starts = RunDir(str(tmp_path / "a")).placements()
    assert [(start["host"], start["nice"]) for start in starts] == [(socket.gethostname(), os.nice(0))]  # not Ray's 15
    with pytest.raises(UsageError, match="runs failed: ") as failure:
        runner.run_tasks(tasks([("crash", "crash"), ("empty", "no-results"), ("ok", "finished"), ("later", "finished"),
                                ("refused", "refused")], after=("crash",)), 3)
    assert f"crash (exit code 1; see {tmp_path}/crash/train.log)" in str(failure.value)
    # a run whose folder went with its refusal: what it said, not a log that is gone
    assert "refused (exit code 1: stand_in.py: error: --lr inf: not a finite number)" in str(failure.value)
    assert f"empty (exit code 0; see {tmp_path}/empty/train.log)" in str(failure.value)
    assert "later (not started: crash failed)" in str(failure.value)
    assert "crashed" in (tmp_path / "crash" / "train.log").read_text()
    assert (tmp_path / "ok" / "results.json").is_file()  # the other runs went on
    assert "== ok: finished" in capsys.readouterr().out


# --- a cluster of three nodes on this machine ----------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A head with no CPUs (the drivers connect to it) and worker nodes of 2 CPUs each, every node a
    `ray start --block` process (and what it starts) of its own, so that one can be killed alone."""

    def __init__(self, workers=2):
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes = []
        try:
            self.start("--head", f"--port={self.port}", "--num-cpus=0", "--include-dashboard=false")
            for _ in range(workers):
                self.start(f"--address={self.address}", "--num-cpus=2")
        except BaseException:
            self.stop()
            raise

    def start(self, *flags):
        """One more node, once the cluster counts it (one at a time: nodes that start together on one
        machine can race for the same ports)."""
        self.nodes.append(subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", *flags],
                                           env=CLUSTER_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True))
        assert wait_for(lambda: self.alive() == len(self.nodes), 180), f"{self.alive()} of {len(self.nodes)} nodes up"

    def alive(self):
        done = subprocess.run([RAY, "status", f"--address={self.address}"], env=CLUSTER_ENV, capture_output=True,
                              text=True)
        return done.stdout.count("node_") if done.returncode == 0 else 0

    def kill_node_running(self, pid):
        """Kill the node whose processes include `pid`, and all it started: a machine lost."""
        ancestors = {p.pid for p in psutil.Process(pid).parents()}
        node = next(n for n in self.nodes[1:] if n.pid in ancestors)
        self.kill(node)
        self.nodes.remove(node)

    def stop(self):
        for node in self.nodes:
            self.kill(node)

    @staticmethod
    def kill(node):
        """Kill the node's `ray start` process and every process under it."""
        try:
            tree = [*psutil.Process(node.pid).children(recursive=True), psutil.Process(node.pid)]
        except psutil.NoSuchProcess:
            tree = []
        for process in tree:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        node.wait()


@pytest.fixture(scope="module")
def cluster():
    if ray_once.args[0]:  # the marker's own condition and reason: one place says which backend runs these
        pytest.skip(ray_once.kwargs["reason"])
    # its own temporary folder: a local Ray instance that another test starts meanwhile (the suite runs the
    # backends side by side) would otherwise share /tmp/ray, its latest-session link and its code packages
    CLUSTER_ENV["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray-cluster-")
    made = Cluster()
    try:
        yield made
    finally:
        made.stop()
        shutil.rmtree(CLUSTER_ENV.pop("RAY_TMPDIR"), ignore_errors=True)


def processes_in(path):
    """The processes whose command line names `path`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(str(path) in part for part in process.info["cmdline"] or ()):
            found.append(process.pid)
    return found


def test_reproduce_runs_over_two_nodes_and_a_killed_driver_goes_on(cluster, tmp_path):
    """reproduce.py --smoke --address: its two runs spread over both worker nodes (each run records its
    node), the verdicts come back to the driver. Killed (SIGKILL) once a run has ended, its other run stops
    with it; the same command goes on and redoes no finished run."""
    runs = tmp_path / "runs"
    command = [sys.executable, os.path.join(ROOT, "reproduce.py"), "--smoke", "--only", "main,analysis",
               "--address", cluster.address, "--runs-dir", str(runs)]
    first = subprocess.Popen(command, env=CLUSTER_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ended = lambda: sorted(p.parent.name for p in runs.glob("*/*/results.json")  # noqa: E731
                           if p.parent.parent.name != "results")  # not what --smoke publishes
    try:
        assert wait_for(lambda: len(ended()) >= 1 or first.poll() is not None, 600), "no run ended"
        assert first.poll() is None, first.stdout.read()
        nodes = {json.loads(p.read_text())[0]["node"] for p in runs.glob("*/*/placement.json")}
        assert len(nodes) == 2  # both runs started at once, one on each worker node
        first.kill()
        first.wait()
    finally:
        first.kill()
    before = ended()
    assert wait_for(lambda: not processes_in(runs), 60), "the killed driver's runs went on"
    again = subprocess.run(command, env=CLUSTER_ENV, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    started = {line.split(": started")[0][3:] for line in again.stdout.splitlines() if ": started" in line}
    assert started and not {f"{name}/{name}" for name in before} & started  # nothing finished is redone
    assert sorted(ended()) == ["analysis", "main"] and "verdicts (smoke" in again.stdout


DRIVER = """import json, sys
from reproduction import runner
address, run_dir, flags = sys.argv[1], sys.argv[2], sys.argv[3:]
engine = runner.Engine(address)
task = runner.Task("moved", run_dir, ("train_nmt.py", *flags, "--out", run_dir), env=(("KERAS_BACKEND", "jax"),),
                   resume=("train_nmt.py", *flags, "--out", run_dir, "--resume"))
(_, outcome), = engine.wait([engine.submit(task)])
print("OUTCOME", json.dumps(outcome))
"""


def test_a_run_whose_node_is_killed_finishes_on_another_with_the_same_numbers(cluster, tmp_path):
    """A training run on the cluster; its node is killed (every process of it) after its first epoch's
    checkpoint. Ray runs its task again on the other node, which goes on from that checkpoint; its results
    and validation curve are those of the same run never interrupted, run here without Ray. The corpus: 5,000
    synthetic pairs, an epoch of about 650 tiny updates (several seconds, in which to kill the node)."""
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus", synthetic.synthetic_pairs(count=5200, seed=3), 5000, 100)
    flags = ["--preset", "tiny", "--data-dir", str(corpus), "--epochs", "3", "--test-sentences", "40", "--beam", "1"]
    reference, moved = tmp_path / "reference", tmp_path / "moved"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, cluster.address, str(moved), *flags], cwd=ROOT,
                              env=dict(CLUSTER_ENV, PYTHONPATH=ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        assert wait_for(lambda: RunDir(str(moved)).holds_run() or driver.poll() is not None, 300), "no checkpoint"
        training = [pid for pid in processes_in(moved) if psutil.Process(pid).cmdline()[1:2] == ["train_nmt.py"]]
        assert training, "the run ended before its node could be killed"
        cluster.kill_node_running(training[0])
        plain = subprocess.run([sys.executable, "train_nmt.py", *flags, "--out", str(reference)], cwd=ROOT,
                               env=dict(os.environ, KERAS_BACKEND="jax", **runner.thread_env(1, 1)),
                               capture_output=True, text=True)
        assert plain.returncode == 0, plain.stderr[-2000:]
        out, err = driver.communicate(timeout=600)
    finally:
        driver.kill()
    assert driver.returncode == 0, err[-3000:]
    # Ray may write its own lines to the driver's output after it (a busy node's "lagging heartbeats")
    said = [line[len("OUTCOME "):] for line in out.splitlines() if line.startswith("OUTCOME ")]
    assert said, out[-3000:]
    outcome = json.loads(said[-1])
    assert outcome["code"] == 0 and outcome["resumed"], outcome
    starts = RunDir(str(moved)).placements()
    assert len(starts) == 2 and starts[0]["node"] != starts[1]["node"] and starts[1]["resumed"]
    want, got = RunDir(str(reference)), RunDir(str(moved))
    keys = ("updates", "final_valid_loss", "best_valid_loss", "test_bleu")
    assert {k: got.results()[k] for k in keys} == {k: want.results()[k] for k in keys}
    assert [(r["updates"], r["valid_loss"]) for r in got.rows()] == [(r["updates"], r["valid_loss"]) for r in want.rows()]


@ray_once
def test_a_node_that_sees_another_folder_or_cannot_write_is_named(tmp_path):
    """What each node checks before a cluster's runs start (`Engine.check_shared`): it reads the driver's mark
    in the runs folder and writes beside it."""
    mark = tmp_path / ".seen-1"
    assert runner._sees(str(mark)).startswith("cannot use it")  # no such file there: another machine's disk
    mark.write_text("other")
    assert runner._sees(str(mark)) == "sees another folder at that path"
    mark.write_text("seen")
    assert runner._sees(str(mark)) is None and sorted(os.listdir(tmp_path)) == [".seen-1"]


@ray_once
def test_an_address_where_no_cluster_answers_is_refused_in_one_line():
    """--address HOST:PORT with nothing listening: one line and exit code 2 in a second or two (Ray itself
    keeps trying for minutes)."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, "reproduce.py"), "--only", "main", "--address",
                           f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "no Ray cluster answers there" in done.stderr
