"""Several processes on one machine (harness/devices.py, harness/files.py): two processes on 127.0.0.1, each
feeding its own rows of every global batch to `model.fit`, end with the weights of one process trained
on the whole batches; a process that dies makes the other exit with one clear line instead of hanging.

jax: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID (one CPU device each, gloo collectives);
tensorflow: TF_CONFIG with two workers (MultiWorkerMirroredStrategy). torch has no multi-process path.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import types

import keras
import numpy as np
import pytest
from conftest import XLA_TESTS

from harness import devices, files
from harness.console import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "multiprocess_worker.py")
BACKEND = keras.backend.backend()
several = pytest.mark.skipif(BACKEND not in ("jax", "tensorflow"),
                             reason=f"KERAS_BACKEND={BACKEND} trains in one process here; several processes "
                             "are implemented for jax and tensorflow")


def _free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _env(index, ports):
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    for key in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TF_CONFIG"):
        env.pop(key, None)
    env["XLA_FLAGS"] = XLA_TESTS  # the suite's (conftest.py), not the devices the parent process asked for
    if index is None:  # the single process
        return env
    if BACKEND == "jax":
        env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{ports[0]}", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID=str(index))
    else:
        env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                       "task": {"type": "worker", "index": index}})
    return env


def _start(tmp_path, tag, index, ports, *flags):
    out = tmp_path / f"{tag}.npz"
    log = open(tmp_path / f"{tag}-{index}.log", "w+")
    process = subprocess.Popen([sys.executable, WORKER, str(out), *flags], cwd=ROOT, env=_env(index, ports),
                               stdout=log, stderr=subprocess.STDOUT, text=True)
    return process, log


def _finish(process, log, timeout=150):
    try:
        process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    log.seek(0)
    return process.returncode, log.read()


def _summary(text):
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


# jax: model.fit over each process's rows. tensorflow: train_on_batch on the per-replica slices (Keras
# 3.15's fit over a distributed dataset of dict inputs fails in its symbolic build: strategy.reduce of
# a nested structure); the scripts run Keras's train step on the same slices (callbacks._fit_tf_workers).
LOOP = "fit" if BACKEND == "jax" else "train_on_batch"
STEPS = 3
LR = 5e-4  # train_nmt.PRESETS["tiny"]["lr"], as the worker uses


@several
def test_two_processes_train_like_one(tmp_path):
    ports = _free_ports(2)
    flags = ("--loop", LOOP, "--steps", str(STEPS))
    two = [_start(tmp_path, "two", i, ports, *flags) for i in range(2)]
    one = _start(tmp_path, "one", None, ports, *flags)
    results = [_finish(*p) for p in two + [one]]
    for code, text in results:
        assert code == 0, text[-3000:]
    chief, other, alone = (_summary(text) for _, text in results)
    assert (chief["process_index"], other["process_index"]) == (0, 1)
    assert chief["chief"] and not other["chief"] and alone["chief"]
    assert chief["config"]["processes"] == 2 and chief["config"]["devices"] == 2 and chief["replicas"] == 2
    assert alone["config"]["processes"] == 1
    with np.load(tmp_path / "one.npz") as a, np.load(tmp_path / "two.npz") as b:
        assert float(a["update"]) > 1e-3  # the steps really moved the weights ...
        names = [k for k in a.files if k != "update"]
        assert names and sorted(names) == sorted(k for k in b.files if k != "update")
        diff = {k: float(np.abs(a[k] - b[k]).max()) for k in names}
    # The attention key biases have a zero gradient in exact arithmetic (softmax(q.(k + b)) is the same
    # for any b: it adds q.b to a whole row of scores), so what they get is rounding noise that Adam
    # scales up to +-lr a step whatever its size; that noise differs with the order of the sums.
    noise = [k for k in names if k.endswith("/key/bias")]
    assert noise and all(diff[k] <= 2 * STEPS * LR for k in noise)
    worst = max((diff[k], k) for k in names if k not in noise)
    assert worst[0] < 1e-5, worst  # ... and the same way in two processes as in one


@several
def test_a_dead_process_ends_the_other_with_a_message(tmp_path):
    ports = _free_ports(2)
    timeout = 10
    flags = ("--loop", LOOP, "--steps", "40", "--stop-after", "2", "--peer-timeout", str(timeout))
    started = [_start(tmp_path, "dead", i, ports, *flags) for i in range(2)]
    start = time.monotonic()
    (code, text), (code_dead, _) = [_finish(*p, timeout=120) for p in started]
    assert code_dead == -signal.SIGKILL, code_dead  # it was killed, as asked
    assert code == files.PEER_EXIT_CODE, text[-3000:]
    lines = [line for line in text.splitlines() if "stopped answering" in line]
    assert lines and "process 0:" in lines[-1] and "--resume" in lines[-1], text[-3000:]
    assert time.monotonic() - start < 120
    print(f"{time.monotonic() - start:.0f} s:", lines[-1])


@several
def test_a_process_whose_peer_never_starts_ends_with_a_message(tmp_path):
    ports = _free_ports(2)
    start = time.monotonic()
    code, text = _finish(*_start(tmp_path, "alone", 0, ports, "--loop", LOOP, "--peer-timeout", "5"), timeout=120)
    # jax: exit code 3; tensorflow waits inside the strategy's constructor, holding the interpreter, so
    # harness/files.py's watchdog process ends it with SIGKILL after printing the line.
    assert code == (files.PEER_EXIT_CODE if BACKEND == "jax" else -signal.SIGKILL), text[-3000:]
    assert "process 0: the 2" in text and "did not all" in text and "within --peer-timeout 5 s" in text, text[-3000:]
    assert time.monotonic() - start < 90


def test_each_process_takes_its_own_rows_of_the_padded_batch():
    setup = devices.Setup("data", ["a", "b", "c", "d"], replicas=4)
    batch = ({"source_ids": np.arange(6)[:, None] + 1}, np.arange(6)[:, None] + 1)
    rows = []
    for index in range(2):
        setup.processes, setup.process_index = 2, index
        inputs, labels = setup.shard(batch)
        assert labels.shape == (4, 1) and (inputs["source_ids"] == labels).all()
        rows.append(labels[:, 0])
    assert list(np.concatenate(rows)) == [1, 2, 3, 4, 5, 6, 0, 0]  # padded to 8, split 4 + 4, in order
    assert list(setup.feed(batch)[1][:, 0]) == [5, 6, 0, 0]  # what the scripts' datasets give model.fit


@pytest.mark.parametrize("env, message", [
    (dict(JAX_COORDINATOR_ADDRESS="127.0.0.1:1234"), "set JAX_NUM_PROCESSES"),
    (dict(JAX_COORDINATOR_ADDRESS="127.0.0.1:1234", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="2"),
     "JAX_PROCESS_ID 2 is outside 0 .. 1"),
    (dict(TF_CONFIG=json.dumps({"cluster": {"worker": ["a:1", "b:2"]}})), "its \"task\" is {}"),
])
def test_bad_process_settings_are_named(monkeypatch, env, message):
    for key in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "TF_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    join = files._join_tensorflow if "TF_CONFIG" in env else lambda: files._join_jax(60)
    with pytest.raises(UsageError, match=message):
        join()
    assert files.process_count() == 1


def test_distribute_none_with_several_processes_is_refused(monkeypatch):
    monkeypatch.setitem(files.PROCESS, "count", 2)
    with pytest.raises(UsageError, match="--distribute none trains in one process, but 2 were started"):
        devices._check_several(types.SimpleNamespace(distribute="none"))


def test_a_lost_peer_is_recognised_under_any_exception_class():
    """jax reports a killed peer as XlaRuntimeError, JaxRuntimeError or, for gloo's "Connection reset by
    peer" in an all-gather, a plain ValueError; each must end the process with the one line."""
    gloo = ValueError("UNKNOWN: Gloo AllGather failed: [pair.cc:538] Read error [127.0.0.1]:24459: "
                      "Connection reset by peer")
    assert files._is_peer_error("jax", gloo)
    try:
        try:
            raise gloo
        except ValueError as inner:
            raise RuntimeError("while saving the checkpoint") from inner
    except RuntimeError as outer:
        assert files._is_peer_error("jax", outer)  # found along the chain
    assert not files._is_peer_error("jax", ValueError("Cannot reshape a tensor of shape (2, 3)"))
    assert not files._is_peer_error("jax", KeyboardInterrupt())
