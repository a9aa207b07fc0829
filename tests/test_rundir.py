"""harness/rundir.py's RunDir, the owner of a run directory, and the failed-write path of harness/files.py:
what --resume goes on from after each kind of save, the leftovers of interrupted saves, and a write that
fails (a file larger than the process may write stands in for a full disk) as one WriteError line."""

import contextlib
import json
import os
import resource
import signal
import zipfile

import numpy as np

import pytest
from conftest import tiny_translation

from harness import files
from harness.console import UsageError, WriteError
from harness.callbacks import resume_point
from harness.files import RANDOM_STATE, seed_generators
from harness.rundir import RunDir
from models import TranslationTransformer


@pytest.fixture(scope="module")
def model():
    model = tiny_translation("pre", dropout=0.1)  # Dropout layers: random generators to save
    model.build()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)  # saved and loaded with its slots, as after training
    return model


def test_resume_needs_a_run_and_a_new_run_needs_none(tmp_path):
    with pytest.raises(UsageError, match="has no finished epoch to resume from"):
        RunDir.start(str(tmp_path / "new"), resume=True)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / files.STATE).write_text("{}")
    with pytest.raises(UsageError, match="already holds a run; pass --resume"):
        RunDir.start(str(tmp_path / "old"), resume=False)


def test_epoch_then_backup_then_resume_points(tmp_path, model, capsys):
    out = str(tmp_path / "run")
    run_dir = RunDir.start(out, resume=False)
    run_dir.save_epoch(model, 1, 10)
    run_dir.write_rows([dict(epoch=1, updates=10, valid_loss=1.0), dict(epoch=2, updates=12, valid_loss=0.9)])
    start = resume_point(RunDir.start(out, resume=True), TranslationTransformer, batches_per_epoch=10)
    assert (start.epoch, start.skip, start.updates, start.loss_state) == (2, 0, 10, None)
    assert [r["updates"] for r in start.rows] == ["10"]  # a killed epoch's rows are redone
    assert f"resuming {out} after epoch 1 (10 updates)" in capsys.readouterr().out

    run_dir.save_backup(model, 2, 3, 13, [5.0, 2.0])
    state = json.load(open(os.path.join(out, files.STATE)))
    assert state["epoch"] == 1 and state["backup"]["batch"] == 3  # the finished epoch is kept beside the backup
    open(os.path.join(out, "checkpoints", ".partial-1-epoch2.keras"), "w").close()  # an interrupted save
    start = resume_point(RunDir.start(out, resume=True), TranslationTransformer, batches_per_epoch=10)
    assert (start.epoch, start.skip, start.updates, start.loss_state) == (2, 3, 13, [5.0, 2.0])
    assert [r["updates"] for r in start.rows] == ["10", "12"]
    assert not [name for name in os.listdir(os.path.join(out, "checkpoints")) if name.startswith(".partial")]
    assert f"resuming {out} in epoch 2 after update 13 (batch 3 of 10)" in capsys.readouterr().out


def test_step_resume_point(tmp_path, model):
    out = str(tmp_path / "bert")
    run_dir = RunDir.start(out, resume=False, unit="step")
    run_dir.save_step(model, 4, [1.5, 3.0], 12.5)
    run_dir.save_step(model, 8, [2.5, 3.0], 20.0)
    start = resume_point(RunDir.start(out, resume=True, unit="step"), TranslationTransformer)
    assert (start.updates, start.loss_state, start.elapsed_s) == (8, [2.5, 3.0], 20.0)
    assert start.checkpoint.endswith("step8.keras")


def test_a_checkpoint_carries_the_dropout_generators_and_a_resume_sets_them(tmp_path, model, capsys):
    """Keras's .keras files leave out each Dropout's SeedGenerator state; the checkpoint's RANDOM_STATE entry
    holds it, and resume_point sets it (an older checkpoint without it resumes, with a warning)."""
    out = str(tmp_path / "run")
    run_dir = RunDir.start(out, resume=False)
    generators = seed_generators(model)
    assert generators and len(generators) == len(model.non_trainable_variables) - len(model.non_trainable_weights)
    drawn = [[v.numpy().tolist()[0], 7 + i] for i, v in enumerate(generators)]
    for variable, value in zip(generators, drawn):
        variable.assign(np.asarray(value, dtype=variable.dtype))  # as after 7 + i masks
    run_dir.save_epoch(model, 1, 10)
    path = os.path.join(out, "checkpoints", "epoch1.keras")
    with zipfile.ZipFile(path) as archive:
        assert json.loads(archive.read(RANDOM_STATE)) == {"seed_generators": drawn}
    start = resume_point(RunDir.start(out, resume=True), TranslationTransformer, batches_per_epoch=10)
    assert [v.numpy().tolist() for v in seed_generators(start.model)] == drawn
    assert "warning" not in capsys.readouterr().err

    with zipfile.ZipFile(path) as old, zipfile.ZipFile(path + ".old", "w") as older:  # saved before the entry
        for item in old.infolist():
            if item.filename != RANDOM_STATE:
                older.writestr(item, old.read(item.filename))
    os.replace(path + ".old", path)
    start = resume_point(RunDir.start(out, resume=True), TranslationTransformer, batches_per_epoch=10)
    assert [v.numpy().tolist()[1] for v in seed_generators(start.model)] == [0] * len(drawn)
    assert "holds no usable random state" in capsys.readouterr().err


@contextlib.contextmanager
def small_files():
    """Writes of more than 4 KiB fail with EFBIG in this process (SIGXFSZ ignored), as on a full disk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


def test_a_failed_write_is_one_line_and_leaves_no_partial_file(tmp_path):
    path = str(tmp_path / "metrics.csv")
    with small_files(), pytest.raises(WriteError) as error:
        files.write_atomic(path, "x" * 10000)
    assert str(error.value).startswith(f"cannot write {path} (") and "\n" not in str(error.value)
    assert os.listdir(tmp_path) == []


def test_a_failed_checkpoint_names_what_resume_goes_on_from(tmp_path, model):
    out = str(tmp_path / "run")
    run_dir = RunDir.start(out, resume=False)
    run_dir.save_epoch(model, 1, 10)
    with small_files(), pytest.raises(WriteError) as error:
        run_dir.save_epoch(model, 2, 20)
    message = str(error.value)
    assert message.startswith(f"cannot write {os.path.join(out, 'checkpoints', 'epoch2.keras')} (")
    assert message.endswith(f"{out} is intact up to epoch 1: make room and run the same command with --resume")
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["epoch1.keras"]
    assert json.load(open(os.path.join(out, files.STATE)))["epoch"] == 1


def test_step_checkpoints_are_listed_by_update_and_glue_reads_them_through_the_run(tmp_path):
    from harness.glue import checkpoint_paths

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for name in ("step10.keras", "step2.keras", "backup.keras", "step3.keras.tmp", "stepx.keras"):
        (run / "checkpoints" / name).write_bytes(b"")
    expected = [str(run / "checkpoints" / f"step{n}.keras") for n in (2, 10)]
    assert RunDir(str(run)).step_checkpoints() == expected
    assert checkpoint_paths([str(run)]) == checkpoint_paths([str(run / "checkpoints")]) == expected
    assert checkpoint_paths(["a.keras"]) == ["a.keras"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no checkpoints/stepN.keras"):
        checkpoint_paths([str(tmp_path / "empty")])


def test_the_outcome_files_of_every_job_go_through_the_run_directory(tmp_path):
    run_dir = RunDir(str(tmp_path))
    run_dir.write_json("eval.json", {"bleu": 1.5})
    run_dir.write_csv("table.csv", [{"a": 1, "b": 2}])
    assert json.loads((tmp_path / "eval.json").read_text()) == {"bleu": 1.5}
    assert files.read_csv(str(tmp_path / "table.csv")) == [{"a": "1", "b": "2"}]
    with pytest.raises(WriteError, match="nothing of this run was saved yet"):
        RunDir(str(tmp_path / "missing" / "deeper")).write_json("eval.json", {})


def test_a_run_folder_has_one_writer(tmp_path, capsys):
    """A second run (here train_nmt.py, and a --resume) on a folder that a live process holds is refused in one
    line naming that process, and leaves the folder as it was; once the holder has died, the folder is free."""
    import subprocess
    import sys

    import pretrain_bert
    import train_nmt

    out = str(tmp_path / "run")
    os.makedirs(out)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from harness import files; "
                               f"files.lock_run_dir({out!r}); print('held', flush=True); time.sleep(600)"],
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = sorted(os.listdir(out))
        for main, flags in ((train_nmt.main, []), (train_nmt.main, ["--resume"]), (pretrain_bert.main, [])):
            assert main(["--preset", "tiny", "--out", out, *flags]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"{out} is in use by another run (process {holder.pid})" in err[0], err
            assert sorted(os.listdir(out)) == before
    finally:
        holder.kill()
        holder.wait()
    files.lock_run_dir(out)  # the lock went with its process
    files.unlock_run_dirs()


def test_resume_goes_on_with_the_runs_own_settings(tmp_path):
    """--resume without other flags takes the run's settings from its config.json (here the tiny preset, not the
    default cpu one); --epochs and --max-updates extend it; another model is refused."""
    import train_nmt

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(dict(flags=dict(preset="tiny", lr=2e-3, out=str(out)))))
    spec = train_nmt.parse_args(["--resume", "--out", str(out)])
    assert (spec.preset, spec.d_model, spec.lr, spec.vocab_size) == ("tiny", 32, 2e-3, train_nmt.PRESETS["tiny"]["vocab_size"])
    assert train_nmt.parse_args(["--resume", "--out", str(out), "--max-updates", "9", "--epochs", "4"]).epochs == 4
    with pytest.raises(UsageError, match="was trained with --lr 0.002, not 0.001"):
        train_nmt.parse_args(["--resume", "--out", str(out), "--lr", "1e-3"])
