"""Faults and determinism of train_nmt.py and pretrain_bert.py: SIGKILL mid-run then --resume, a truncated
checkpoint, same seed twice (pretrain_bert.py: the section at the end, fixture `bert_runs`).

The runs are shared by the tests and made by one fixture, `runs`, two at a time: a reference run, a run
killed for real (a subprocess) and resumed, and a copy of the reference with a truncated checkpoint. Runs
are compared on every metrics.csv column except the throughput (tokens_per_s), and on the test BLEU.

Determinism: batch order comes from --seed, the dropout masks from the model's random generators (whose
states each checkpoint carries: the runs here train with dropout 0.1 so that a resume must restore them), and
CPU kernels of jax (XLA), tensorflow (graph mode on CPU, XLA on GPUs) and torch (eager) are deterministic for
this model, so a run is reproduced bit for bit on the same backend and machine, resumed or not, in this
process or another.
TOLERANCE (relative) is therefore 0; raise it here, with the backend and the reason, if a platform ever
is not bit-exact (GPU kernels with atomics, for example).
"""

import contextlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import types

import keras
import pytest
from conftest import once, write_corpus

import train_nmt
from harness import synthetic
from harness.files import CONFIG, read_csv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCHS = 2
COMMON = ["--preset", "tiny", "--vocab-size", "120", "--beam", "1", "--max-tokens", "128", "--epochs", str(EPOCHS),
          "--seed", "7", "--valid-sentences", "8", "--max-len-b", "20",  # short translations: quick decoding
          "--dropout", "0.1"]  # the tiny preset has none; with it, a resume must restore the dropout generators
TIMING = {"tokens_per_s"}  # columns that measure the machine, not the model
TOLERANCE = 0.0


def short_pairs():
    """Short German-English pairs: 7 to 14 tokens, so few compiled shapes (6 at 128 tokens a batch)."""
    import random

    pairs = []
    for gender, de_sg, de_pl, en_sg, en_pl in synthetic._NOUNS:
        for verb in synthetic._INTRANSITIVE:
            pairs.append((f"{dict(m='Der', f='Die', n='Das')[gender]} {de_sg} {verb[0]} .", f"The {en_sg} {verb[4]} ."))
            pairs.append((f"Die {de_pl} {verb[1]} .", f"The {en_pl} {verb[5]} ."))
    random.Random(0).shuffle(pairs)
    return pairs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return str(write_corpus(tmp_path_factory.mktemp("short-corpus"), short_pairs()[:136], 120, 8))


def argv(corpus, out, *extra):
    return [*COMMON, "--data-dir", corpus, "--out", str(out), *extra]


def metrics(out):
    return [{k: v for k, v in row.items() if k not in TIMING} for row in read_csv(os.path.join(out, "metrics.csv"))]


def assert_same(rows, expected, step="epoch"):
    """Rows of two metrics.csv files: the same steps (`step` column), the same values (TOLERANCE)."""
    assert [r[step] for r in rows] == [r[step] for r in expected]
    for row, want in zip(rows, expected):
        for key, value in want.items():
            if TOLERANCE and _is_float(value):
                assert math.isclose(float(row[key]), float(value), rel_tol=TOLERANCE), (key, row, want)
            else:
                assert row[key] == value, (key, row, want)


def _is_float(text):
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def bleu_of(out):
    return json.loads(open(os.path.join(out, "results.json")).read())["test_bleu"]


def state_epoch(out):
    try:
        return json.loads(open(os.path.join(out, "state.json")).read())["epoch"]
    except FileNotFoundError:
        return 0


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory):
    """Every training run of this file, two at a time (a subprocess beside this process), for time:

    killed:    from scratch in a subprocess, SIGKILLed as soon as epoch EPOCHS - 1 is on disk (in the last epoch),
               then resumed in this process;
    reference: from scratch in this process, uninterrupted, while `killed` runs;
    truncated: a copy of `reference` with its newest checkpoint cut in half, resumed in a subprocess while
               `killed` resumes.
    """
    return _fault_runs(tmp_path_factory.mktemp("faults"), "train_nmt.py", train_nmt.main,
                       lambda out, *extra: argv(corpus, out, *extra), f"epoch{EPOCHS}.keras",
                       kill_in_last_epoch, state_epoch, metrics)


def _fault_runs(root, script, main, make_argv, newest, kill, finished, rows_of):
    """The killed, reference and truncated runs of one script (see `runs`), two at a time.

    main: the script's main(argv); make_argv(out, *extra): its arguments for run directory `out`;
    newest: the file name of the run's last checkpoint; kill(process, out): SIGKILL the subprocess when
    the run in `out` has reached the point to kill it at; finished(out), rows_of(out): what state.json
    and metrics.csv show.
    """
    r = types.SimpleNamespace(**{name: str(root / name) for name in ("reference", "killed", "truncated")})
    children = [spawn(make_argv(r.killed), root / "killed", script)]
    try:
        watcher = threading.Thread(target=kill, args=(children[0], r.killed), daemon=True)
        watcher.start()
        assert main(make_argv(r.reference)) == 0
        shutil.copytree(r.reference, r.truncated)  # a moved run directory resumes too: checkpoints are found in it
        os.remove(os.path.join(r.truncated, "results.json"))  # killed while writing its last checkpoint: no results
        truncate(os.path.join(r.truncated, "checkpoints", newest))
        children.append(spawn(make_argv(r.truncated, "--resume"), root / "truncated", script))
        watcher.join(timeout=600)
        r.killed_code = children[0].wait(timeout=60)
        r.killed_log = (root / "killed.out").read_text() + (root / "killed.err").read_text()
        r.finished, r.rows_at_kill = finished(r.killed), rows_of(r.killed)
        r.results_at_kill = os.path.exists(os.path.join(r.killed, "results.json"))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            r.resume_code = main(make_argv(r.killed, "--resume"))
        r.resume_out, r.resume_err = out.getvalue(), err.getvalue()
        r.truncated_code = children[1].wait(timeout=600)
        r.truncated_out, r.truncated_err = ((root / f"truncated.{s}").read_text() for s in ("out", "err"))
    finally:
        for child in children:  # only after a failure is one still running
            if child.poll() is None:
                child.kill()
                child.wait()
    return r


def spawn(args, log, script="train_nmt.py"):
    """SCRIPT in a subprocess on this backend; its stdout and stderr go to LOG.out and LOG.err."""
    # jax: the subprocesses share compiled programs through jax's persistent cache (the same programs, so the
    # same numbers; the in-process runs, compiled afresh, check that). tensorflow's XLA cache misses here.
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend(), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0.3",
               JAX_COMPILATION_CACHE_DIR=str(log.parent / "jax-cache"))
    with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
        return subprocess.Popen([sys.executable, os.path.join(ROOT, script), *args], cwd=str(log.parent),
                                env=env, stdout=out, stderr=err)


def kill_in_last_epoch(proc, out, timeout=600):
    """SIGKILL `proc` once state.json, written last at the end of an epoch, names epoch EPOCHS - 1."""
    deadline = time.time() + timeout
    while state_epoch(out) < EPOCHS - 1 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)


def truncate(path):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])


def test_same_seed_gives_the_same_metrics(runs):
    """Two runs from scratch with one seed, in two processes: the same metrics (TOLERANCE above)."""
    assert 1 <= runs.finished < EPOCHS, runs.killed_log[-3000:]
    rows = [r for r in runs.rows_at_kill if int(r["epoch"]) <= runs.finished]
    assert len(rows) == runs.finished
    assert_same(rows, metrics(runs.reference)[:runs.finished])


def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(runs):
    assert runs.killed_code == -signal.SIGKILL, f"the run ended by itself before the kill:\n{runs.killed_log[-3000:]}"
    assert 1 <= runs.finished < EPOCHS and not runs.results_at_kill
    assert runs.resume_code == 0, runs.resume_err[-3000:]
    # At most one checkpoint interval (the epoch that was running) is lost: training goes on after the last
    # finished epoch, and only the epochs after it are trained again.
    assert f"resuming {runs.killed} after epoch {runs.finished} " in runs.resume_out
    # Each validation prints "epoch E, update U: ..."; the epochs named are the epochs trained.
    trained = [int(line.split(",")[0].split()[1]) for line in runs.resume_out.splitlines()
               if line.startswith("epoch ") and ", update " in line]
    assert sorted(set(trained)) == trained == list(range(runs.finished + 1, EPOCHS + 1))
    assert_same(metrics(runs.killed), metrics(runs.reference))
    assert bleu_of(runs.killed) == bleu_of(runs.reference)
    assert not [p for p in os.listdir(os.path.join(runs.killed, "checkpoints")) if p.startswith(".partial")]


def backup_of(out):
    """The mid-epoch backup state.json names (--backup-every), or None."""
    try:
        return json.loads(open(os.path.join(out, "state.json")).read()).get("backup")
    except (FileNotFoundError, ValueError):
        return None


def test_sigkill_after_a_step_backup_resumes_from_that_update(runs, corpus, tmp_path):
    """--backup-every 1: SIGKILLed within the last epoch, after a step backup and before the epoch's end, the run
    resumes from that update (not from the epoch before) and equals the uninterrupted run."""
    out = str(tmp_path / "run")
    child = spawn(argv(corpus, out, "--backup-every", "1"), tmp_path / "killed")
    try:
        deadline = time.time() + 600
        while (backup_of(out) or {}).get("epoch") != EPOCHS and child.poll() is None and time.time() < deadline:
            time.sleep(0.005)
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        code = child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    log = (tmp_path / "killed.out").read_text() + (tmp_path / "killed.err").read_text()
    assert code == -signal.SIGKILL, f"the run ended by itself before the kill:\n{log[-3000:]}"
    backup = backup_of(out)
    per_epoch = json.loads(open(os.path.join(out, "config.json")).read())["updates_per_epoch"]
    assert backup["epoch"] == EPOCHS and 1 <= backup["batch"] < per_epoch, backup
    assert not os.path.exists(os.path.join(out, "results.json"))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert train_nmt.main(argv(corpus, out, "--resume", "--backup-every", "1")) == 0
    assert (f"resuming {out} in epoch {EPOCHS} after update {backup['updates']} (batch {backup['batch']} of "
            f"{per_epoch})") in stdout.getvalue()
    assert backup["updates"] == (EPOCHS - 1) * per_epoch + backup["batch"]
    assert_same(metrics(out), metrics(runs.reference))
    assert bleu_of(out) == bleu_of(runs.reference)
    assert "backup" not in json.loads(open(os.path.join(out, "state.json")).read())  # the epoch's end replaced it


def test_truncated_newest_checkpoint_falls_back_to_the_previous_one(runs):
    assert runs.truncated_code == 0, runs.truncated_err[-3000:]
    newest = os.path.join(runs.truncated, "checkpoints", f"epoch{EPOCHS}.keras")
    warning = [line for line in runs.truncated_err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and f"{newest} cannot be loaded" in warning[0], runs.truncated_err[-3000:]
    assert f"resuming from epoch {EPOCHS - 1}" in warning[0]
    assert f"resuming {runs.truncated} after epoch {EPOCHS - 1} " in runs.truncated_out
    rows = metrics(runs.truncated)
    assert len(rows) == EPOCHS
    assert_same(rows, metrics(runs.reference))  # the last epoch's row was dropped and computed again, the same
    assert json.loads(open(os.path.join(runs.truncated, "state.json")).read())["epoch"] == EPOCHS
    assert bleu_of(runs.truncated) == bleu_of(runs.reference)
    from harness.callbacks import load_checkpoint

    load_checkpoint(newest)  # written again, whole


def test_no_loadable_checkpoint_is_one_clear_line(runs, corpus, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(runs.reference, out)
    os.remove(out / "results.json")  # a run stopped before its end (a finished one is refused before: it has ended)
    for epoch in range(1, EPOCHS + 1):
        truncate(out / "checkpoints" / f"epoch{epoch}.keras")
    before = sorted(os.listdir(out))
    assert train_nmt.main(argv(corpus, out, "--resume")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "no checkpoint can be loaded" in err and "start it again with a new --out" in err
    assert sorted(os.listdir(out)) == before


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of DISK_BYTES, mounted for the test and unmounted after (root on Linux; skipped elsewhere):
    (mount point, `grow()` that gives it room, as freeing space would)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip() or done.returncode}): needs root on Linux")
    try:
        yield mount, lambda: subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


DISK_BYTES = 900 * 1024  # room for the vocabulary, config.json and epoch1.keras, not for epoch2.keras as well


@once("a checkpoint file that cannot be written (Keras writes .keras files the same way under each)")
def test_a_full_disk_is_one_line_then_resume_finishes_exactly(runs, corpus, small_disk):
    """A checkpoint that cannot be written (the disk is full) ends the run with one line naming the file
    and what --resume goes on from, exit code 4 and no partial file; with room again, --resume finishes
    the run exactly as the uninterrupted reference."""
    mount, grow = small_disk
    out = str(mount / "run")
    # TF_CPP_MIN_LOG_LEVEL=3, as in tests/test_bad_input.py: TensorFlow's own C++ log lines (on a machine
    # with CUDA libraries and no GPU, "E0000 ... failed call to cuInit: ... CUDA error") are not the run's.
    first = subprocess.run([sys.executable, os.path.join(ROOT, "train_nmt.py"), *argv(corpus, out)], cwd=str(mount.parent),
                           env=dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="3"),
                           capture_output=True, text=True)
    errors = [line for line in first.stderr.splitlines() if "error" in line]
    assert first.returncode == 4, first.stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in first.stderr, first.stderr[-3000:]
    assert errors[0].startswith("train_nmt.py: error: cannot write ") and f"epoch{EPOCHS}.keras" in errors[0]
    assert "intact up to epoch 1" in errors[0] and "--resume" in errors[0]
    assert state_epoch(out) == EPOCHS - 1
    assert not [p for p in os.listdir(os.path.join(out, "checkpoints")) if p.startswith(".partial")]
    grow()
    assert train_nmt.main(argv(corpus, out, "--resume")) == 0
    assert_same(metrics(out), metrics(runs.reference))
    assert bleu_of(out) == bleu_of(runs.reference)


# --- pretrain_bert.py ------------------------------------------------------------------------------
# The same three faults for BERT pretraining, whose checkpoints are counted in updates: STEPS updates,
# a checkpoint (checkpoints/stepN.keras, then state.json) and a metrics.csv row every INTERVAL updates.
# Batches are a function of (seed, update), the runs train with dropout (--dropout 0.1
# --attention-dropout 0.1; the tiny preset has none), whose generators' states a resume restores, and every run
# is given one WordPiece vocabulary (--vocab): where merge counts tie, the WordPiece trainer may pick other
# pieces in another process, and two vocabularies would make two different models.

BERT_STEPS, INTERVAL = 8, 2
BERT_TIMING = {"elapsed_s"}


@pytest.fixture(scope="module")
def bert_corpus(tmp_path_factory):
    """(corpus file, tokenizer file): 30 generated documents of 6 sentences in BERT's format, and a
    WordPiece vocabulary learned once from the corpus's training documents."""
    import random

    from harness import bert_data

    words = dict(noun="cat dog river teacher garden window city letter painter mountain engine village".split(),
                 verb="sees finds paints follows builds crosses remembers carries".split(),
                 adjective="small old quiet bright distant careful heavy green".split())
    rng = random.Random(5)

    def sentence():
        pick = lambda kind: rng.choice(words[kind])  # noqa: E731
        return f"The {pick('adjective')} {pick('noun')} {pick('verb')} the {pick('noun')} near the {pick('noun')}."

    root = tmp_path_factory.mktemp("bert-corpus")
    path = root / "docs.txt"
    path.write_text("\n\n".join("\n".join(sentence() for _ in range(6)) for _ in range(30)) + "\n")
    documents, _ = bert_data.load_corpus([str(path)])
    train_documents, _ = bert_data.split_documents(documents, seed=7)
    _, tokenizer = bert_data.build_tokenizer(train_documents, 256, str(root / "vocab"))
    return str(path), tokenizer


def bert_argv(bert_corpus, out, *extra):
    corpus, tokenizer = bert_corpus
    return ["--preset", "tiny", "--recipe", "pre-no-warmup", "--steps", str(BERT_STEPS), "--save-every",
            str(INTERVAL), "--eval-every", str(INTERVAL), "--seed", "7", "--dropout", "0.1", "--attention-dropout", "0.1",
            "--corpus", corpus, "--vocab", tokenizer, "--out", str(out), *extra]


def bert_metrics(out):
    return [{k: v for k, v in row.items() if k not in BERT_TIMING}
            for row in read_csv(os.path.join(out, "metrics.csv"))]


def bert_state(out):
    try:
        return json.loads(open(os.path.join(out, "state.json")).read())["updates"]
    except (FileNotFoundError, ValueError):  # not written yet (it is written atomically; ValueError for safety)
        return 0


def kill_after_first_checkpoint(proc, out, timeout=600):
    """SIGKILL `proc` as soon as state.json names a checkpoint (update INTERVAL or later)."""
    deadline = time.time() + timeout
    while bert_state(out) < INTERVAL and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)


@pytest.fixture(scope="module")
def bert_runs(bert_corpus, tmp_path_factory):
    """pretrain_bert.py's runs, two at a time, as `runs` does for train_nmt.py:

    killed:    from scratch in a subprocess, SIGKILLed once the first checkpoint is on disk, resumed in this process;
    reference: from scratch in this process, uninterrupted, while `killed` runs;
    truncated: a copy of `reference` with its newest checkpoint (step BERT_STEPS) cut in half, resumed in a
               subprocess while `killed` resumes.
    """
    import pretrain_bert

    return _fault_runs(tmp_path_factory.mktemp("bert-faults"), "pretrain_bert.py", pretrain_bert.main,
                       lambda out, *extra: bert_argv(bert_corpus, out, *extra), f"step{BERT_STEPS}.keras",
                       kill_after_first_checkpoint, bert_state, bert_metrics)


def bert_results(out):
    results = json.loads(open(os.path.join(out, "results.json")).read())
    # The code's fingerprint is compared; the commit and the date may differ between runs made at other times.
    results["code_version"] = results["code_version"]["fingerprint"]
    return {k: v for k, v in results.items() if k not in ("elapsed_s", "out")}


def test_bert_same_seed_gives_the_same_metrics(bert_runs):
    """pretrain_bert.py twice from scratch with one seed, in two processes: the same metrics.csv rows."""
    assert INTERVAL <= bert_runs.finished < BERT_STEPS, bert_runs.killed_log[-3000:]
    rows = [r for r in bert_runs.rows_at_kill if int(r["updates"]) <= bert_runs.finished]
    assert len(rows) == bert_runs.finished // INTERVAL
    assert_same(rows, bert_metrics(bert_runs.reference)[:len(rows)], step="updates")


def test_bert_sigkill_mid_run_then_resume_matches_an_uninterrupted_run(bert_runs):
    r = bert_runs
    assert r.killed_code == -signal.SIGKILL, f"the run ended by itself before the kill:\n{r.killed_log[-3000:]}"
    assert INTERVAL <= r.finished < BERT_STEPS and not r.results_at_kill
    assert r.resume_code == 0, r.resume_err[-3000:]
    # At most one checkpoint interval is lost: the run goes on from the checkpoint state.json names, and the
    # updates done after it when the kill came (a metrics row at most, written before its checkpoint) are redone.
    assert max(int(row["updates"]) for row in r.rows_at_kill) - r.finished <= INTERVAL
    assert f"resuming {r.killed} at update {r.finished}" in r.resume_out
    assert "warning" not in r.resume_err
    evaluated = [line.split(":")[0] for line in r.resume_out.splitlines() if line.startswith("update ")]
    assert evaluated == [f"update {u}" for u in range(r.finished + INTERVAL, BERT_STEPS + 1, INTERVAL)]
    assert_same(bert_metrics(r.killed), bert_metrics(r.reference), step="updates")
    assert bert_results(r.killed) == bert_results(r.reference)
    assert json.loads(open(os.path.join(r.killed, "state.json")).read())["updates"] == BERT_STEPS
    assert not [p for p in os.listdir(os.path.join(r.killed, "checkpoints")) if p.startswith(".partial")]


def test_bert_truncated_newest_checkpoint_falls_back_to_the_previous_one(bert_runs):
    r = bert_runs
    assert r.truncated_code == 0, r.truncated_err[-3000:]
    newest = os.path.join(r.truncated, "checkpoints", f"step{BERT_STEPS}.keras")
    previous = BERT_STEPS - INTERVAL
    warning = [line for line in r.truncated_err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and f"{newest} cannot be loaded" in warning[0], r.truncated_err[-3000:]
    assert f"resuming from step {previous} " in warning[0]
    assert f"resuming {r.truncated} at update {previous}" in r.truncated_out
    rows = bert_metrics(r.truncated)
    assert len(rows) == BERT_STEPS // INTERVAL
    assert_same(rows, bert_metrics(r.reference), step="updates")  # the last row was dropped and computed again, the same
    assert json.loads(open(os.path.join(r.truncated, "state.json")).read())["updates"] == BERT_STEPS
    assert bert_results(r.truncated) == bert_results(r.reference)
    from harness.callbacks import load_checkpoint

    load_checkpoint(newest)  # written again, whole


def test_ctrl_c_is_one_line_and_exit_code_130_then_resume_finishes(corpus, tmp_path, monkeypatch):
    """SIGINT (Ctrl-C) after the first epoch's checkpoint: training ends after the update under way with one line,
    exit code 130 and no traceback, on every backend (jax would swallow a KeyboardInterrupt raised inside its
    garbage-collection callback; the handler only sets a flag there); no checkpoint half-saved and no temporary
    folder of Keras left; --resume then finishes the run."""
    out, scratch = tmp_path / "run", tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # where Keras's temporary folders would be left
    flags = argv(corpus, out, "--epochs", str(EPOCHS + 3))
    proc = spawn(flags, tmp_path / "interrupted")
    deadline = time.time() + 600
    while state_epoch(out) < 1 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=600)
    err = open(tmp_path / "interrupted.err").read()
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "Exception ignored" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and re.fullmatch(r"train_nmt\.py: interrupted at update \d+; --resume goes on from the "
                                            r"last checkpoint", lines[0]), err[-3000:]
    assert not [p for p in os.listdir(out / "checkpoints") if p.startswith(".partial")]
    assert os.listdir(scratch) == []
    resumed = spawn([*flags, "--resume"], tmp_path / "resumed")
    assert resumed.wait(timeout=900) == 0, open(tmp_path / "resumed.err").read()[-3000:]
    assert json.loads((out / "results.json").read_text())["outcome"] == "finished"


def test_ctrl_c_before_the_first_checkpoint_leaves_nothing(corpus, tmp_path):
    """SIGINT while the first epoch trains: nothing was saved, so the one line says to run the command again
    (not --resume, which would refuse a folder without a checkpoint), and the folder the command created is
    gone with its lock file, so the same command then starts without --overwrite."""
    out = tmp_path / "new" / "run"
    flags = argv(corpus, out, "--epochs", str(EPOCHS + 3))
    proc = spawn(flags, tmp_path / "interrupted")
    deadline = time.time() + 600
    while not (out / CONFIG).exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert state_epoch(out) == 0, "the first epoch ended before the signal: make the run longer"
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=600)
    err = open(tmp_path / "interrupted.err").read()
    assert code == 130 and "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "interrupted" in line]
    assert len(lines) == 1 and re.fullmatch(r"train_nmt\.py: interrupted( at update \d+)?, before the first checkpoint: "
                                            r"nothing was saved; run the command again", lines[0]), err[-3000:]
    assert not (tmp_path / "new").exists()
