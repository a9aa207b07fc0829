"""The bad-input catalogue: every row is one bad input to one script, answered by exit code 2 and one line.

A row is (id, argv builder, expected substring). The builder gets an `Inputs` (a good corpus, a fresh
--out path, bad files made on demand) and returns the command line: optional NAME=value environment
settings, the script's file name, then its arguments. Rows with environment settings run as a subprocess
(Keras picks its backend at import); the others call the script's entry point in this process.

Each row must give: exit code 2; on stderr exactly one line, "SCRIPT: error: ...", holding the expected
substring (the problem, and the fix where it is not obvious) and no traceback; no --out directory and
no temporary or partial file left behind. To add a script, add its entry point to ENTRY_POINTS and its
rows to CATALOGUE.

Not an error, so not here: a --vocab-size larger than a small corpus supports is capped with a note
(train_nmt.py) or met with fewer pieces (sentencepiece's soft limit); a --vocab-size smaller than the
corpus's character set is the genuinely bad case.
"""

import importlib
import importlib.util
import os
import subprocess
import sys

import keras
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENTRY_POINTS = {"train_nmt.py": ("train_nmt", "main"), "analyze_grads.py": ("analyze_grads", "cli"),
                "pretrain_bert.py": ("pretrain_bert", "main")}
BACKENDS = ("jax", "tensorflow", "torch")  # run_all_backends.py's order


class Inputs:
    """What a row's builder gets. `corpus`: a good corpus; `out`: an --out path that must not appear."""

    def __init__(self, tmp_path, corpus):
        self.tmp, self.corpus, self.out = tmp_path, corpus, str(tmp_path / "out")

    def data(self, kind):
        """A copy of the good corpus with one fault: its directory (or, for "file", a regular file)."""
        data = self.tmp / f"data-{kind}"
        data.mkdir()
        for name in os.listdir(self.corpus):
            (data / name).write_bytes(open(os.path.join(self.corpus, name), "rb").read())
        if kind == "missing":
            os.remove(data / "valid.en")
        elif kind == "empty":
            (data / "train.de").write_bytes(b"")
            (data / "train.en").write_bytes(b"\n\n")
        elif kind == "mismatch":
            (data / "train.en").write_text("one\ntwo\n", encoding="utf-8")
        elif kind == "latin1":
            (data / "test.de").write_bytes("Der Hund schläft .\n".encode("latin-1"))
        elif kind == "binary":
            (data / "train.de").write_bytes(bytes(range(256)) * 4)
        elif kind == "directory":
            os.remove(data / "train.de")
            (data / "train.de").mkdir()
        elif kind == "file":
            (self.tmp / "data.txt").write_text("Der Hund schläft .\n", encoding="utf-8")
            return str(self.tmp / "data.txt")
        return str(data)

    def blocked_out(self):
        """An --out path below a regular file: it cannot be created."""
        (self.tmp / "a-file").write_text("x")
        return str(self.tmp / "a-file" / "run")

    def checkpoint(self, kind):
        """A checkpoint in a run directory's layout: corrupt, of another vocabulary, or of another model."""
        folder = self.tmp / "run" / "checkpoints"
        folder.mkdir(parents=True)
        path = str(folder / "epoch1.keras")
        if kind == "corrupt":  # the first bytes of a zip file, then nothing: a truncated checkpoint
            open(path, "wb").write(b"PK\x03\x04" + b"\0" * 60)
            return path
        from conftest import tiny_bert, tiny_translation

        model = tiny_translation("pre", vocab_size=50) if kind == "vocab" else tiny_bert("post", vocab_size=120)
        model.build() if kind == "vocab" else model.build({"token_ids": (None, 8), "segment_ids": (None, 8),
                                                           "mask_positions": (None, 2)})
        model.save(path)
        return path

    def text(self, kind):
        """A bad --corpus for pretrain_bert.py: blank lines only, binary, or a directory with no text file."""
        if kind == "blank":
            (self.tmp / "blank.txt").write_text("\n\n   \n\t\n", encoding="utf-8")
            return str(self.tmp / "blank.txt")
        if kind == "binary":
            (self.tmp / "corpus.bin").write_bytes(bytes(range(256)) * 4)
            return str(self.tmp / "corpus.bin")
        folder = self.tmp / "no-text"  # only an empty sub-folder and a hidden file, which are skipped
        (folder / "empty").mkdir(parents=True)
        (folder / ".hidden.txt").write_text("A hidden sentence .\n", encoding="utf-8")
        return str(folder)

    def glue(self, kind):
        """An MRPC folder (train.tsv, dev.tsv) with wrong columns in dev.tsv or a label outside {0, 1}."""
        folder = self.tmp / "mrpc"
        folder.mkdir()
        header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
        rows = [f"{'2' if kind == 'label' and i == 1 else i % 2}\t{i}\t{i + 1}\tThe dog runs .\tA dog runs ."
                for i in range(4)]
        for split in ("train", "dev"):
            lines = ["a\tb\tc", "1\tx\ty"] if kind == "columns" and split == "dev" else [header, *rows]
            (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        return str(folder)

    def run_folder(self):
        """A train_nmt.py run folder at the tiny preset, as its config.json and state.json say (no checkpoint)."""
        folder = self.tmp / "run"
        folder.mkdir()
        (folder / "config.json").write_text('{"flags": {"preset": "tiny"}, "given": ["preset"], "preset": "tiny"}')
        (folder / "state.json").write_text('{"epoch": 1, "updates": 4}')
        return str(folder)

    def bert_init(self):
        """A BertMaskedLM checkpoint in a pretrain_bert.py run directory's layout (config.json names a tokenizer)."""
        path = self.checkpoint("bert")
        (self.tmp / "run" / "config.json").write_text('{"tokenizer": "vocab/wordpiece.json"}')
        return path


def nmt(t, *extra, data=None):
    return ["train_nmt.py", "--preset", "tiny", "--data-dir", data or t.corpus, "--out", t.out, "--vocab-size", "120",
            "--beam", "1", *extra]


def grads(t, *extra, data=None):
    return ["analyze_grads.py", "fig3-layers", "--preset", "tiny", "--out", t.out, *extra,
            *(["--data-dir", data] if data else [])]


def evaluate(t, checkpoint):
    return ["train_nmt.py", "--preset", "tiny", "--data-dir", t.corpus, "--vocab-size", "120", "--beam", "1",
            "--eval-only", checkpoint]


def bert(t, *extra, corpus=None):
    return ["pretrain_bert.py", "--preset", "tiny", "--corpus", corpus or t.corpus, "--out", t.out, *extra]


def finetune(t, glue, init):
    return ["pretrain_bert.py", "--preset", "tiny", "--finetune", "mrpc", "--glue-dir", glue, "--init", init,
            "--out", t.out]


CATALOGUE = [
    # --- train_nmt.py: data files
    ("nmt-missing-file", lambda t: nmt(t, data=t.data("missing")), "valid.en: file not found; pass --data-dir"),
    ("nmt-empty-file", lambda t: nmt(t, data=t.data("empty")), "are empty; the train split needs sentence pairs"),
    ("nmt-mismatched-files", lambda t: nmt(t, data=t.data("mismatch")), "train.de has 70 lines but"),
    ("nmt-not-utf8", lambda t: nmt(t, data=t.data("latin1")), "test.de: line 1 is not valid UTF-8"),
    ("nmt-binary-file", lambda t: nmt(t, data=t.data("binary")), "train.de: looks binary"),
    ("nmt-directory-for-file", lambda t: nmt(t, data=t.data("directory")), "train.de: is a directory"),
    ("nmt-file-for-data-dir", lambda t: nmt(t, data=t.data("file")), "not a directory; it should hold"),
    # --- train_nmt.py: choices and numbers
    ("nmt-unknown-norm", lambda t: nmt(t, "--norm", "sandwich"), "argument --norm: invalid choice: 'sandwich' (choose from"),
    ("nmt-unknown-schedule", lambda t: nmt(t, "--schedule", "cosine"), "argument --schedule: invalid choice: 'cosine'"),
    ("nmt-unknown-optimizer", lambda t: nmt(t, "--optimizer", "adagrad"), "argument --optimizer: invalid choice: 'adagrad'"),
    ("nmt-unknown-preset", lambda t: nmt(t, "--preset", "huge"), "argument --preset: invalid choice: 'huge' (choose from"),
    ("nmt-zero-lr", lambda t: nmt(t, "--lr", "0"), "--lr must be positive, got 0"),
    ("nmt-negative-lr", lambda t: nmt(t, "--lr", "-0.0005"), "--lr must be positive, got -0.0005"),
    ("nmt-zero-benchmark-sentences", lambda t: ["train_nmt.py", "--preset", "tiny", "--benchmark", "1", "--benchmark-sentences", "0"],
     "--benchmark-sentences must be a positive number, got 0"),
    ("nmt-zero-peak-tflops", lambda t: ["train_nmt.py", "--preset", "tiny", "--benchmark", "1", "--peak-tflops", "0"],
     "--peak-tflops must be a positive number of TFLOP/s, got 0.0"),
    ("nmt-infinite-lr", lambda t: nmt(t, "--lr", "inf"), "--lr must be a finite number, got inf"),
    ("nmt-nan-lr", lambda t: nmt(t, "--lr", "nan"), "--lr must be a finite number, got nan"),
    ("nmt-max-tokens-beyond-memory", lambda t: nmt(t, "--max-tokens", "1000000000000"),
     "--max-tokens 1000000000000 is above 1,048,576, the most this project allows"),
    ("nmt-translate-beam-beyond-memory", lambda t: ["train_nmt.py", "--translate", t.run_folder(), "--beam", "100000"],
     "--beam 100000 is above 256, the most this project allows"),
    ("nmt-resume-with-another-model", lambda t: nmt(t)[:3] + ["--out", t.run_folder(), "--resume", "--d-model", "64"],
     "was trained with --d-model 32, not 64; leave it out to continue the run as it was"),
    ("nmt-zero-epochs", lambda t: nmt(t, "--epochs", "0"), "--epochs must be a positive integer, got 0"),
    ("nmt-negative-max-updates", lambda t: nmt(t, "--max-updates", "-5"), "--max-updates must be >= 0, got -5"),
    ("nmt-zero-max-tokens", lambda t: nmt(t, "--max-tokens", "0"), "--max-tokens must be a positive integer"),
    ("nmt-max-tokens-below-a-bucket", lambda t: nmt(t, "--max-tokens", "8"),
     "--max-tokens 8 is too small; use at least 16"),
    ("nmt-warmup-longer-than-training", lambda t: nmt(t, "--warmup-steps", "1000", "--epochs", "1"),
     "is not shorter than training"),
    ("nmt-min-len-above-max-len", lambda t: nmt(t, "--max-len-b", "2", "--min-len", "3"),
     "--min-len 3 must be >= 0 and at most --max-len-b 2"),
    ("nmt-zero-vocab", lambda t: nmt(t, "--vocab-size", "0"), "--vocab-size must be a positive integer"),
    ("nmt-vocab-below-the-characters", lambda t: nmt(t, "--vocab-size", "20"),
     "--vocab-size 20 is too small for this corpus"),
    # --- train_nmt.py: checkpoints and run directories
    ("nmt-eval-missing-checkpoint", lambda t: evaluate(t, str(t.tmp / "nothing.keras")),
     "file not found; pass a .keras file"),
    ("nmt-eval-directory-checkpoint", lambda t: evaluate(t, str(t.tmp)), "not a run of train_nmt.py (no config.json)"),
    ("nmt-eval-corrupt-checkpoint", lambda t: evaluate(t, t.checkpoint("corrupt")),
     "cannot be loaded (not a zip archive: truncated"),
    ("nmt-eval-other-vocabulary", lambda t: evaluate(t, t.checkpoint("vocab")), "has a vocabulary of 50 but the data"),
    ("nmt-eval-other-model", lambda t: evaluate(t, t.checkpoint("bert")),
     "holds a BertMaskedLM, not a TranslationTransformer"),
    ("nmt-resume-without-a-run", lambda t: nmt(t, "--resume"), "has no finished epoch to resume from"),
    ("nmt-unwritable-out", lambda t: nmt(t)[:5] + ["--out", t.blocked_out()], "cannot write there"),
    ("nmt-unknown-backend", lambda t: ["KERAS_BACKEND=nonsense", *nmt(t)],
     "KERAS_BACKEND=nonsense: Unable to import backend"),
    ("nmt-unsupported-backend", lambda t: ["KERAS_BACKEND=numpy", *nmt(t)], "KERAS_BACKEND=numpy"),
    ("nmt-not-a-number", lambda t: nmt(t, "--epochs", "three"), "argument --epochs/--max-epoch: invalid int value: 'three'"),
    ("nmt-unknown-corpus", lambda t: ["train_nmt.py", "--preset", "tiny", "--corpus", "wmt14", "--out", t.out],
     "argument --corpus: invalid choice: 'wmt14' (choose from"),
    ("nmt-negative-eval-every", lambda t: nmt(t, "--eval-every", "-1"), "--eval-every must be >= 0, got -1"),
    ("nmt-wmt14-archive-missing", lambda t: nmt(t, "--prepare-wmt14", str(t.tmp), "--src", "en", "--tgt", "de",
                                                data=str(t.tmp / "wmt14")),
     "training-parallel-europarl-v7.tgz: archive not found; put training-parallel-europarl-v7.tgz"),
    ("nmt-wmt14-without-data-dir", lambda t: ["train_nmt.py", "--preset", "tiny", "--prepare-wmt14", str(t.tmp),
                                              "--out", t.out], "--prepare-wmt14 needs --data-dir"),
    # --- train_nmt.py: sweeps and --translate
    ("nmt-unknown-sweep", lambda t: nmt(t, "--sweep", "fig9"), "argument --sweep: invalid choice: 'fig9'"),
    ("nmt-zero-jobs", lambda t: nmt(t, "--sweep", "depth", "--jobs", "0"), "--jobs must be a positive number"),
    ("nmt-bad-depths", lambda t: nmt(t, "--sweep", "depth", "--depths", "6,x"),
     "is not a comma-separated list of positive integers"),
    ("nmt-translate-not-a-run", lambda t: ["train_nmt.py", "--translate", str(t.tmp / "absent")],
     "file not found; pass a .keras file"),
    ("nmt-translate-a-folder-not-a-run", lambda t: ["train_nmt.py", "--translate", str(t.tmp), "--input",
                                                    t.text("blank")],
     "not a run of train_nmt.py (no config.json); pass a run directory (runs/NAME) or a checkpoint inside one"),
    ("nmt-out-is-a-file", lambda t: nmt(t)[:5] + ["--out", t.text("blank")],
     "cannot write there (a file, not a directory); choose another directory"),
    ("nmt-translate-missing-input", lambda t: ["train_nmt.py", "--translate", str(t.tmp), "--input",
                                               str(t.tmp / "absent.de")], "absent.de: no such file; pass a text file"),
    # --- train_nmt.py: one mode per command line, no contradictory flags, nothing created on the way
    ("nmt-two-modes", lambda t: nmt(t, "--sweep", "fig2", "--translate", str(t.tmp)),
     "--sweep and --translate are different modes; give one of them per command line"),
    ("nmt-flag-of-an-absent-mode", lambda t: nmt(t, "--depths", "6,12"), "--depths only applies with --sweep"),
    ("nmt-depths-of-another-sweep", lambda t: nmt(t, "--sweep", "fig2", "--depths", "6"),
     "--depths sets the depths of --sweep depth, not of --sweep fig2"),
    ("nmt-no-warmup-and-warmup", lambda t: nmt(t, "--no-warmup", "--warmup-steps", "100"),
     "--no-warmup and --warmup-updates 100 contradict each other"),
    ("nmt-translate-with-a-training-flag", lambda t: ["train_nmt.py", "--translate", str(t.tmp), "--epochs", "3"],
     "--epochs does not apply to --translate"),
    ("nmt-eval-not-a-checkpoint", lambda t: evaluate(t, t.data("file")),
     "data.txt: is not a .keras file; pass a .keras file that a run of this project wrote"),
    ("nmt-resume-below-a-missing-folder", lambda t: nmt(t)[:5] + ["--out", str(t.tmp / "new" / "run"), "--resume"],
     "has no finished epoch to resume from"),
    ("nmt-default-out-bad-data", lambda t: ["train_nmt.py", "--preset", "tiny", "--data-dir", t.data("missing"),
                                            "--vocab-size", "120"],
     "valid.en: file not found"),
    # --- analyze_grads.py
    ("grads-unknown-analysis", lambda t: grads(t)[:1] + ["fig5"] + grads(t)[2:],
     "argument analysis: invalid choice: 'fig5' (choose from"),
    ("grads-unknown-preset", lambda t: grads(t, "--preset", "huge"), "argument --preset: invalid choice: 'huge'"),
    ("grads-bad-depths", lambda t: grads(t, "--depths", "6,eight"), "'6,eight' is not a comma-separated list of positive integers"),
    ("grads-unknown-norm", lambda t: grads(t, "--norms", "post,middle"), "--norms: unknown placement middle"),
    ("grads-negative-lr", lambda t: grads(t, "--lr", "-1"), "--lr must be positive"),
    ("grads-flag-of-another-analysis", lambda t: grads(t)[:1] + ["deepnet"] + grads(t)[2:] + ["--simplified"],
     "deepnet does not read --simplified (lemma2); drop it, or run the analysis it belongs to"),
    ("grads-zero-max-tokens", lambda t: grads(t, "--max-tokens", "0"), "--max-tokens must be a positive integer"),
    ("grads-max-tokens-beyond-memory", lambda t: grads(t, "--max-tokens", "1000000000000"),
     "--max-tokens 1000000000000 is above 1,048,576"),
    ("grads-infinite-lr", lambda t: grads(t)[:1] + ["deepnet"] + grads(t)[2:] + ["--lr", "inf"],
     "--lr must be a finite number, got inf"),
    ("grads-missing-data-dir", lambda t: grads(t, data=str(t.tmp / "absent")), "not a directory"),
    ("grads-binary-file", lambda t: grads(t, data=t.data("binary")), "train.de: looks binary"),
    ("grads-vocab-below-the-characters", lambda t: grads(t, "--vocab-size", "20", data=t.corpus),
     "--vocab-size 20 is too small for this corpus"),
    ("grads-unwritable-out", lambda t: grads(t)[:4] + ["--out", t.blocked_out(), "--random-tokens"],
     "cannot write there"),
    ("grads-backend-not-installed", lambda t: ["KERAS_BACKEND=openvino", *grads(t, "--random-tokens")],
     "KERAS_BACKEND=openvino: No module named 'openvino'"),
    # --- pretrain_bert.py (--corpus is the NMT corpus folder: every file a document, so a good corpus)
    ("bert-blank-corpus", lambda t: bert(t, corpus=t.text("blank")), "no text in the corpus"),
    ("bert-binary-corpus", lambda t: bert(t, corpus=t.text("binary")), "corpus.bin: looks binary"),
    ("bert-folder-without-text", lambda t: bert(t, corpus=t.text("folder")), "no-text: no text in the corpus"),
    ("bert-missing-corpus", lambda t: bert(t, corpus=str(t.tmp / "nowhere.txt")),
     "nowhere.txt: no such file or directory"),
    ("bert-unknown-recipe", lambda t: bert(t, "--recipe", "cosine"),
     "argument --recipe: invalid choice: 'cosine' (choose from"),
    ("bert-unknown-norm", lambda t: bert(t, "--norm", "sandwich"), "argument --norm: invalid choice: 'sandwich' (choose from"),
    ("bert-zero-lr", lambda t: bert(t, "--lr", "0"), "--lr must be positive, got 0"),
    ("bert-zero-steps", lambda t: bert(t, "--steps", "0"), "--total-updates must be a positive integer, got 0"),
    ("bert-zero-batch-size", lambda t: bert(t, "--batch-size", "0"), "--batch-size must be a positive integer, got 0"),
    ("bert-batch-size-beyond-memory", lambda t: bert(t, "--batch-size", "100000000"),
     "--batch-size 100000000 is above 65,536"),
    ("bert-infinite-clip-norm", lambda t: bert(t, "--clip-norm", "inf"), "--clip-norm must be a finite number, got inf"),
    ("bert-warmup-longer-than-training", lambda t: bert(t, "--warmup-steps", "9", "--steps", "4"),
     "--warmup-updates 9 is not shorter than training (4 updates); lower --warmup-updates or raise --total-updates"),
    ("bert-finetune-wrong-columns", lambda t: finetune(t, t.glue("columns"), t.bert_init()),
     "dev.tsv: columns a, b, c; MRPC needs the header Quality, #1 ID, #2 ID, #1 String, #2 String"),
    ("bert-finetune-unknown-label", lambda t: finetune(t, t.glue("label"), t.bert_init()),
     "line 3: label '2' is not one of MRPC's labels (0, 1)"),
    ("bert-finetune-other-model", lambda t: finetune(t, t.glue("good"), t.checkpoint("vocab")),
     "a TranslationTransformer checkpoint, another architecture"),
    ("bert-finetune-corrupt-init", lambda t: finetune(t, t.glue("good"), t.checkpoint("corrupt")),
     "not a Keras .keras file; pass a checkpoint of pretrain_bert.py"),
    ("bert-resume-without-a-run", lambda t: bert(t, "--resume"), "has no checkpoint to resume from"),
    ("bert-unwritable-out", lambda t: bert(t)[:5] + ["--out", t.blocked_out()], "cannot write there"),
    ("bert-finetune-flag-without-finetune", lambda t: bert(t, "--seeds", "3"),
     "--seeds only applies with --finetune mrpc|rte"),
    ("bert-finetune-with-a-pretraining-flag", lambda t: finetune(t, t.glue("good"), t.bert_init()) + ["--steps", "5"],
     "--total-updates does not apply to --finetune"),
    ("bert-no-warmup-and-warmup", lambda t: bert(t, "--no-warmup", "--warmup-updates", "5"),
     "--no-warmup and --warmup-updates 5 contradict each other"),
    ("bert-more-devices-than-exist", lambda t: ["KERAS_BACKEND=jax", *bert(t, "--distribute", "model",
                                                                          "--model-parallel", "64")],
     "--model-parallel 64 asks for more devices than the"),
]


# Rows that a fix outside this test's reach still has to make pass (strict: they fail once fixed, to be removed).
XFAIL = {}  # rows that are known to fail, with the reason (none today)


@pytest.fixture(scope="module")
def corpus(corpus_dir):
    return str(corpus_dir)


def run(command, cwd, capsys):
    """(exit code, stderr) of a catalogue command line."""
    env = {}
    while "=" in command[0] and not command[0].endswith(".py"):
        name, value = command.pop(0).split("=", 1)
        env[name] = value
    script, args = command[0], command[1:]
    if env:  # a subprocess: the variables matter at import time
        proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=cwd, capture_output=True,
                              text=True, timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **env))
        return proc.returncode, proc.stderr
    module, function = ENTRY_POINTS[script]
    try:
        code = getattr(importlib.import_module(module), function)(args)
    except SystemExit as exit_:  # argparse's errors
        code = exit_.code
    return code, capsys.readouterr().err


def leftovers(root):
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if ".tmp" in f or ".partial" in f]


def test_the_catalogue_has_20_distinct_rows():
    ids = [row[0] for row in CATALOGUE]
    assert len(ids) >= 20 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("build, expected", [
    pytest.param(build, expected, id=name,
                 marks=[pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else [])
    for name, build, expected in CATALOGUE])
def test_bad_input_is_one_line_and_exit_code_2(build, expected, corpus, tmp_path, capsys, monkeypatch):
    t = Inputs(tmp_path, corpus)
    command = build(t)
    if "=" in command[0] and not command[0].endswith(".py"):
        # Backend-independent: run once, in the first backend's pytest process of run_all_backends.py.
        first = next(b for b in BACKENDS if importlib.util.find_spec(b) is not None)
        if keras.backend.backend() != first:
            pytest.skip(f"a subprocess row: run under KERAS_BACKEND={first} only")
        if "openvino" in command[0] and importlib.util.find_spec("openvino") is not None:
            pytest.skip("openvino is installed here")
    monkeypatch.chdir(tmp_path)  # a default runs/ directory would land here
    before = set(os.listdir(tmp_path))
    code, err = run(list(command), str(tmp_path), capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    script = next(c for c in command if c.endswith(".py"))
    assert lines[0].startswith(f"{script}: error: ") and expected in lines[0], lines[0]
    assert not os.path.exists(t.out), "an --out directory was left behind"
    assert set(os.listdir(tmp_path)) - before == set(), "a folder (runs/, or one above --out) was left behind"
    assert not leftovers(tmp_path)


def test_a_refusal_leaves_an_empty_out_folder_as_it_was(corpus, tmp_path, capsys, monkeypatch):
    """A folder that was there, empty, and refused after the command claimed it (a data file read once the run
    starts): it stays, and keeps no lock file of the refused run."""
    t = Inputs(tmp_path, corpus)
    os.makedirs(t.out)
    monkeypatch.chdir(tmp_path)
    code, err = run(nmt(t, data=t.data("mismatch")), str(tmp_path), capsys)
    assert code == 2 and "train.de has 70 lines but" in err, err
    assert os.listdir(t.out) == []


@pytest.mark.parametrize("script", sorted(ENTRY_POINTS))
def test_help_works_under_a_wrong_backend(script):
    """--help needs no backend: it prints the flags (exit code 0) even where KERAS_BACKEND cannot start."""
    if keras.backend.backend() != next(b for b in BACKENDS if importlib.util.find_spec(b) is not None):
        pytest.skip("backend-independent: run in the first backend's pytest process only")
    done = subprocess.run([sys.executable, os.path.join(ROOT, script), "--help"], capture_output=True, text=True,
                          env=dict(os.environ, KERAS_BACKEND="nonsense"), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script}") and "--out" in done.stdout


@pytest.mark.parametrize("script, flag", [("train_nmt.py", "--lr=-1"), ("pretrain_bert.py", "--lr=-1"),
                                          ("analyze_grads.py", "--seeds=0"), ("train_nmt.py", "--translate=absent-run"),
                                          ("train_nmt.py", "--eval-only=harness"),
                                          ("train_nmt.py", "--data-dir=absent-corpus"),
                                          ("analyze_grads.py", "--data-dir=absent-corpus"),
                                          ("train_nmt.py", "--out=/proc/none/run"), ("pretrain_bert.py", "--out=/proc/none/run"),
                                          ("analyze_grads.py", "--out=/proc/none/run")])
def test_a_refusal_comes_before_the_backends_import(script, flag):
    """A bad flag is refused in one line without importing Keras, whose backend takes seconds to start."""
    if keras.backend.backend() != next(b for b in BACKENDS if importlib.util.find_spec(b) is not None):
        pytest.skip("backend-independent: run in the first backend's pytest process only")
    entry = "cli" if script == "analyze_grads.py" else "main"
    probe = (f"import sys; sys.argv[0] = {script!r}; import {script[:-3]} as s; code = s.{entry}([{flag!r}]); "
             "print('keras' in sys.modules); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and done.stdout.strip() == "False", done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"{script}: error: "), done.stderr


@pytest.mark.parametrize("script", ["train_nmt.py", "analyze_grads.py"])
@pytest.mark.parametrize("fault, expected", [("mismatch", "train.de has 70 lines but"),
                                             ("latin1", "test.de: line 1 is not valid UTF-8")])
def test_a_corpus_fault_is_refused_before_the_backends_import(script, fault, expected, corpus, tmp_path):
    """A --data-dir whose files are not a parallel corpus (misaligned, not UTF-8) is read, and refused in one
    line, before Keras is imported: the refusal needs the files alone."""
    if keras.backend.backend() != next(b for b in BACKENDS if importlib.util.find_spec(b) is not None):
        pytest.skip("backend-independent: run in the first backend's pytest process only")
    data = Inputs(tmp_path, corpus).data(fault)
    entry = "cli" if script == "analyze_grads.py" else "main"
    probe = (f"import sys; sys.argv[0] = {script!r}; import {script[:-3]} as s; code = s.{entry}("
             f"[{'--data-dir=' + str(data)!r}, '--out={tmp_path / 'out'}']); print('keras' in sys.modules); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and done.stdout.strip() == "False", done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()
