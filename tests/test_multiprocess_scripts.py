"""train_nmt.py and pretrain_bert.py as two processes on one machine (docs/several-hosts.md): the same
weights as one process on the whole batches, only the chief writes the run's files, config.json records
the processes, --resume of a two-process run goes on as one process would, and a killed process makes
the other end with one line (exit code 3) instead of hanging.

The processes find each other as in tests/test_multiprocess.py (its helpers start them): jax through
JAX_COORDINATOR_ADDRESS, tensorflow through TF_CONFIG. Each script run compiles its own steps, so the
runs are few, short and shared between the tests of this module.
"""

import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import zipfile

import numpy as np
import pytest
from conftest import write_corpus
from test_multiprocess import BACKEND, ROOT, _env, _finish, _free_ports, several
from test_pretrain_bert import sentence

import train_nmt
from harness import files, synthetic
from harness.files import read_csv

pytestmark = several

# Tiny runs: 24 training pairs packed into 2 batches of one shape (one compilation of the train step), one
# validation and three test sentences, translations of at most 2 tokens (decoding only has to run).
NMT = ["--preset", "tiny", "--vocab-size", "120", "--max-tokens", "512", "--warmup-steps", "1", "--beam", "1",
       "--max-len-b", "2", "--norm", "pre", "--log-every", "1"]
BERT = ["--preset", "tiny", "--steps", "3"]  # the tiny preset warms up for 2 updates; validation at 2 and 3
# Keras 3.15 clips the gradients (BERT's global norm 1.0) before tf.distribute sums the replicas' parts, so
# a clipped update over several tensorflow replicas is not one device's; jax clips the whole gradient.
BERT += ["--clip-norm", "0"] if BACKEND == "tensorflow" else []


def _script(tmp_path, script, tag, index, ports, *flags):
    """Start `script` with `flags` as process `index` of two (None: alone); its output goes to a log."""
    log = open(tmp_path / f"{tag}-{'alone' if index is None else index}.log", "w+")
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, script), *flags], cwd=ROOT,
                               env=_env(index, ports), stdout=log, stderr=subprocess.STDOUT, text=True)
    return process, log


def _two(tmp_path, script, tag, *flags):
    ports = _free_ports(2)
    return [_script(tmp_path, script, tag, i, ports, *flags) for i in range(2)]


def _weights(checkpoint):
    """{path in model.weights.h5: array} of a .keras file (model and optimizer variables)."""
    import h5py

    found = {}
    with zipfile.ZipFile(checkpoint) as archive, h5py.File(io.BytesIO(archive.read("model.weights.h5")), "r") as f:
        f.visititems(lambda name, item: found.__setitem__(name, np.array(item, "float64"))
                     if isinstance(item, h5py.Dataset) else None)
    return found


def _assert_same_weights(one, two, updates, lr):
    a, b = _weights(one), _weights(two)
    assert a and sorted(a) == sorted(b)
    diff = {k: float(np.abs(a[k] - b[k]).max()) for k in a}
    # As in tests/test_multiprocess.py: the attention key biases have a zero gradient in exact arithmetic
    # (softmax(q.(k + b)) is the same for any b), so they get rounding noise that Adam scales up to
    # +-lr an update, and that noise differs with the order of the sums.
    noise = [k for k in a if k.endswith("key_dense/vars/1")]
    assert all(diff[k] <= 2 * updates * lr for k in noise)
    worst = max((diff[k], k) for k in a if k not in noise)
    assert worst[0] < 1e-5, worst


def _ok(results):
    for code, text in results:
        assert code == 0, text[-3000:]
    return [text for _, text in results]


@pytest.fixture(scope="module")
def nmt(tmp_path_factory):
    """One process trains 2 epochs; two processes train 1 epoch, then 2 with --resume (alongside)."""
    tmp = tmp_path_factory.mktemp("nmt")
    corpus = write_corpus(tmp_path_factory.mktemp("corpus"), synthetic.synthetic_pairs(count=28, seed=11), 24, 1)
    flags = NMT + ["--data-dir", str(corpus)]
    one = _script(tmp, "train_nmt.py", "one", None, None, *flags, "--epochs", "2", "--out", str(tmp / "one"))
    first = _ok([_finish(*p) for p in _two(tmp, "train_nmt.py", "first", *flags, "--epochs", "1",
                                           "--out", str(tmp / "two"))])
    state = json.loads((tmp / "two" / "state.json").read_text())
    metrics = (tmp / "two" / "metrics.csv").read_text()
    resumed = _ok([_finish(*p) for p in _two(tmp, "train_nmt.py", "resumed", *flags, "--epochs", "2", "--resume",
                                             "--out", str(tmp / "two"))])
    return dict(tmp=tmp, alone=_ok([_finish(*one)])[0], first=first, resumed=resumed, state=state, metrics=metrics)


def test_translation_in_two_processes_trains_like_one(nmt):
    tmp, lr = nmt["tmp"], train_nmt.PRESETS["tiny"]["lr"]
    per_epoch = nmt["state"]["updates"]
    assert nmt["state"]["epoch"] == 1 and per_epoch == 2
    _assert_same_weights(tmp / "one/checkpoints/epoch1.keras", tmp / "two/checkpoints/epoch1.keras", per_epoch, lr)
    # --resume: every process loads the chief's checkpoint and the second epoch goes on as in one process.
    _assert_same_weights(tmp / "one/checkpoints/epoch2.keras", tmp / "two/checkpoints/epoch2.keras",
                         2 * per_epoch, lr)
    chief = nmt["resumed"][0]
    assert f"resuming {tmp / 'two'} after epoch 1 ({per_epoch} updates)" in chief
    rows = read_csv(str(tmp / "two" / "metrics.csv"))
    assert [r["epoch"] for r in rows] == ["1", "2"] and int(rows[1]["updates"]) == 2 * per_epoch
    assert (tmp / "two" / "metrics.csv").read_text().startswith(nmt["metrics"])  # the first row kept as it was
    alone = read_csv(str(tmp / "one" / "metrics.csv"))
    assert [r["updates"] for r in alone] == [r["updates"] for r in rows]


def test_translation_in_two_processes_only_the_chief_writes_and_speaks(nmt):
    tmp = nmt["tmp"]
    config = json.loads((tmp / "two" / "config.json").read_text())
    assert (config["processes"], config["devices"], config["replicas"], config["distribute_mode"]) == (2, 2, 2, "data")
    alone = json.loads((tmp / "one" / "config.json").read_text())
    assert (alone["processes"], alone["replicas"]) == (1, 1)
    files = lambda run: sorted(os.path.relpath(os.path.join(d, f), run)  # noqa: E731
                               for d, _, fs in os.walk(run) for f in fs)
    assert files(tmp / "two") == files(tmp / "one")  # nothing else (no .tmp, .partial or .write-test file)
    assert "checkpoints/epoch2.keras" in files(tmp / "two") and "results.json" in files(tmp / "two")
    for chief, other in (nmt["first"], nmt["resumed"]):
        assert "data:" in chief and "progress: update" in chief and "test BLEU" in chief
        # Standard output is the chief's; the other's log holds at most gloo's connection line and
        # tensorflow's warning about eager collective calls (on standard error).
        printed = [line for line in other.splitlines() if line.strip() and not line.startswith(
            ("[Gloo] Rank 1 is connected", "WARNING:tensorflow:Using CollectiveAllReduceStrategy eagerly"))]
        assert not printed, other[-3000:]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bert")
    rng = random.Random(5)
    corpus = tmp / "docs.txt"
    corpus.write_text("\n\n".join("\n".join(sentence(rng) for _ in range(6)) for _ in range(30)) + "\n")
    flags = BERT + ["--corpus", str(corpus)]
    two = _ok([_finish(*p) for p in _two(tmp, "pretrain_bert.py", "two", *flags, "--out", str(tmp / "two"))])
    # The WordPiece trainer may pick other pieces where counts tie: the single process takes the vocabulary
    # that the chief learned and the other process read (with one of its own, the two processes' data would differ).
    vocab = tmp / "two" / json.loads((tmp / "two" / "config.json").read_text())["tokenizer"]
    one = _ok([_finish(*_script(tmp, "pretrain_bert.py", "one", None, None, *flags, "--vocab", str(vocab),
                                "--out", str(tmp / "one")))])
    return tmp, two + one


def test_pretraining_in_two_processes_trains_like_one(bert):
    tmp, (chief, other, _) = bert
    config = json.loads((tmp / "two" / "config.json").read_text())
    _assert_same_weights(tmp / "one/checkpoints/step3.keras", tmp / "two/checkpoints/step3.keras", 3, config["lr"])
    assert (config["processes"], config["devices"]) == (2, 2)
    assert "update 3:" in chief and "update 3:" not in other
    one, two = (read_csv(str(tmp / run / "metrics.csv")) for run in ("one", "two"))
    assert [r["updates"] for r in one] == [r["updates"] for r in two] == ["2", "3"]
    assert abs(float(one[-1]["valid_loss"]) - float(two[-1]["valid_loss"])) < 1e-5  # validation of the same model


def test_a_killed_process_ends_the_other_script_with_a_message(tmp_path):
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus", synthetic.synthetic_pairs(count=28, seed=11), 24, 1)
    timeout = 10
    chief, other = _two(tmp_path, "train_nmt.py", "dead", *NMT, "--data-dir", str(corpus), "--epochs", "50",
                        "--out", str(tmp_path / "run"), "--peer-timeout", str(timeout))
    start = time.monotonic()
    while "progress: update 2/" not in open(chief[1].name).read():  # training has started in both
        assert chief[0].poll() is None and time.monotonic() - start < 240, open(chief[1].name).read()[-3000:]
        time.sleep(0.5)
    other[0].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    (code, text), (code_dead, _) = _finish(*chief, timeout=120), _finish(*other)
    assert code_dead == -signal.SIGKILL
    assert code == files.PEER_EXIT_CODE, text[-3000:]
    lines = [line for line in text.splitlines() if "stopped answering" in line]
    assert lines and lines[-1].startswith("process 0: process 1 of the 2 processes") and "--resume" in lines[-1]
    assert time.monotonic() - killed < 6 * timeout
    print(f"{BACKEND}: ended {time.monotonic() - killed:.0f} s after the kill:", lines[-1])


def test_bad_input_ends_both_processes_with_one_line_and_leaves_nothing(tmp_path):
    """The chief fails while learning the vocabulary (chief_first): the other process says so instead
    of waiting, both exit with code 2, and the run directory the chief created is removed."""
    (tmp_path / "corpus").mkdir()
    corpus = write_corpus(tmp_path / "corpus", synthetic.synthetic_pairs(count=28, seed=11), 24, 1)
    runs = _two(tmp_path, "train_nmt.py", "bad", "--preset", "tiny", "--data-dir", str(corpus), "--vocab-size", "10",
                "--out", str(tmp_path / "run"), "--peer-timeout", "30")
    (code, chief), (code_other, other) = [_finish(*p, timeout=120) for p in runs]
    assert (code, code_other) == (2, 2), chief[-3000:] + other[-3000:]
    assert "train_nmt.py: error: --vocab-size 10 is too small" in chief
    assert "train_nmt.py: error: process 0 (the chief) stopped: " in other and "Traceback" not in chief + other
    assert not (tmp_path / "run").exists()
