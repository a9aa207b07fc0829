"""A training run's directory, and the one owner of the files in it: the only module that reads them; and which
code wrote a run (`code_version`, the fingerprint: the section at the end).

    runs/NAME/
      config.json      what ran: the run's spec, backend, versions and devices (`write_config`)
      state.json       where --resume goes on: the newest saved epoch (or step) and a mid-epoch backup
      metrics.csv      one row per validation (`rows`, `write_rows`)
      results.json     the run's outcome and scores (`results`, `write_results`)
      checkpoints/     epochN.keras (train_nmt.py), stepN.keras (pretrain_bert.py), backup.keras
                       (--backup-every): the model with its optimizer state
      placement.json   where each start of the run ran: node, host, GPUs (`add_placement`, for reproduction/runner.py)
      train.log        the run's output, when reproduction/runner.py starts it (`log`)
      .lock            held by the process that writes the run, while it lives (`files.lock_run_dir`)
      curves.png, vocab/

    run_dir = RunDir.start("runs/pre", resume=spec.resume, unit="epoch")  # created; holds a run iff resume
    run_dir.write_config(spec.config(), extra, setup)
    run_dir.save_epoch(model, epoch, updates)                       # epochN.keras, then state.json
    run_dir.save_backup(model, epoch, batch, updates, loss_state)   # backup.keras, then state.json
    run_dir.save_step(model, updates, loss_state, elapsed_s)        # stepN.keras, then state.json
    RunDir("runs/pre").results()                                    # reading: None until the run has ended
    RunDir.of_checkpoint("runs/pre/checkpoints/epoch3.keras").config()

Every file is written through a temporary file and a rename (`files.write_atomic`; checkpoints through
checkpoints/.partial-*), so a run stopped at any point leaves its newest complete files, and state.json
names only a checkpoint that is whole. A write that fails, a full disk for one, raises `console.WriteError`:
one line naming the file, and what --resume will go on from once there is room (exit code 4).

Without Keras (a sweep reads its runs' files before any backend is loaded): loading checkpoints, and
where a resumed run goes on, are harness/callbacks.py's.
"""

import ast
import contextlib
import datetime
import functools
import hashlib
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import tokenize
import zipfile

from harness.console import UsageError, WriteError
from harness.files import (CONFIG, RANDOM_STATE, STATE, holds_run, is_chief, prepare_out_dir, read_csv,
                           seed_generators, write_csv, write_json, writing)

RESULTS = "results.json"  # the run's outcome and scores, once it has ended (`write_results`)
METRICS = "metrics.csv"  # one row per validation (`write_rows`)
PLACEMENT = "placement.json"  # where each start of the run ran (`add_placement`)
LOG = "train.log"  # the run's output, when reproduction/runner.py starts it


class RunDir:
    """The run directory `path` of one run, for reading; `RunDir.start` makes one for training. `unit`:
    "epoch" (checkpoints/epochN.keras, train_nmt.py) or "step" (checkpoints/stepN.keras, pretrain_bert.py)."""

    def __init__(self, path, unit="epoch"):
        self.path, self.unit = path, unit
        self.checkpoints = os.path.join(path, "checkpoints")
        self.vocab = os.path.join(path, "vocab")  # the vocabulary the run learned (BPE, WordPiece) and reads again
        self.state_file = os.path.join(path, STATE)

    @classmethod
    def start(cls, path, resume, unit="epoch"):
        """The run directory of a training run, created: with `resume` it must hold a run (a state.json),
        and without it must not."""
        run_dir = cls(prepare_out_dir(path), unit)  # and its lock: one writer
        what = "finished epoch" if unit == "epoch" else "checkpoint"
        if resume and not holds_run(path):
            raise UsageError(f"--resume: {path} has no {what} to resume from; run without --resume")
        if not resume and holds_run(path):
            raise UsageError(f"{path} already holds a run; pass --resume to continue it or choose another --out")
        return run_dir

    @classmethod
    def of_checkpoint(cls, checkpoint):
        """The run directory that holds a checkpoint (RUN/checkpoints/NAME.keras)."""
        return cls(os.path.dirname(os.path.dirname(os.path.abspath(checkpoint))))

    def refuse_ended(self, total):
        """With --resume: refuse, changing nothing, a run that has ended (results.json) and that these flags
        would train no further (`total` updates, None: not known), instead of decoding it again and writing its
        results anew."""
        ended = self.results()
        if ended and ended.get("outcome") != "stopped" and (ended.get("outcome") == "diverged" or (
                total is not None and ended.get("updates", 0) >= total)):
            raise UsageError(f"--resume: {self.path} has ended ({ended.get('outcome')} after {ended.get('updates')} "
                             "updates, results.json) and these flags train it no further; nothing changed (a larger "
                             "--epochs or --max-updates trains it further)")

    def updates_asked(self, epochs, max_updates):
        """The updates that `epochs` (--epochs) and `max_updates` (--max-updates) train this translation run to
        (None: not known, a run without config.json)."""
        per_epoch = os.path.isfile(self.file(CONFIG)) and self.config().get("updates_per_epoch")
        total = per_epoch and epochs * per_epoch
        return min(total, max_updates) if total and max_updates else total

    def step_checkpoints(self, folder=None):
        """The paths of checkpoints/stepN.keras (pretrain_bert.py; or of `folder`, a folder of them), by N."""
        folder = folder or self.checkpoints
        found = os.listdir(folder) if os.path.isdir(folder) else []
        steps = sorted(int(f[4:-6]) for f in found if f.startswith("step") and f.endswith(".keras") and f[4:-6].isdigit())
        return [os.path.join(folder, f"step{n}.keras") for n in steps]

    def holds_run(self):
        """Whether a run saved its state here (a state.json): what --resume needs."""
        return holds_run(self.path)

    def file(self, name):
        return os.path.join(self.path, name)

    def log(self):
        """train.log, opened to append the output of another start of the run."""
        os.makedirs(self.path, exist_ok=True)
        return open(self.file(LOG), "ab")

    # --- placement.json: where each start of the run ran (reproduction/runner.py records it) -----------------

    def add_placement(self, placement):
        """Add `placement` (node, host, GPUs of one start of the run) to placement.json."""
        write_json(self.file(PLACEMENT), [*self.placements(), placement])

    def placements(self):
        """placement.json's starts, oldest first ([] before the first)."""
        try:
            with open(self.file(PLACEMENT), encoding="utf-8") as f:
                return json.load(f)
        except (OSError, ValueError):
            return []

    # --- config.json, metrics.csv, results.json ---------------------------------------------------

    def write_config(self, settings, extra=None, setup=None):
        self._guarded(write_json, self.file(CONFIG), run_config(settings, extra, setup))

    def config(self):
        """config.json's content (also of runs written before specs: the same keys, less `given`)."""
        with open(self.file(CONFIG)) as f:
            return json.load(f)

    def results(self):
        """results.json's content, or None while the run has not ended (or wrote none)."""
        try:
            with open(self.file(RESULTS)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None

    def rows(self, upto=None, key="updates"):
        """metrics.csv's rows, those with `key` <= `upto` when given."""
        rows = read_csv(self.file(METRICS)) if os.path.exists(self.file(METRICS)) else []
        return rows if upto is None else [r for r in rows if int(r[key]) <= upto]

    def write_rows(self, rows):
        self._guarded(write_csv, self.file(METRICS), rows)

    def write_results(self, result):
        """results.json: `result` and the `code_version` that produced it (`provenance`)."""
        self._guarded(write_json, self.file(RESULTS), dict(result, code_version=code_version()))

    def write_json(self, name, data):
        """Another file of the run's outcome, NAME (JSON): --eval-only's eval.json, an analysis's tables."""
        self._guarded(write_json, self.file(name), data)

    def write_csv(self, name, rows):
        """A table of the run's outcome, NAME (CSV): an analysis's rows, a fine-tuning's accuracies."""
        self._guarded(write_csv, self.file(name), rows)

    # --- checkpoints and state.json ---------------------------------------------------------------

    def save_epoch(self, model, epoch, updates):
        """checkpoints/epochN.keras, then state.json saying it is the newest finished epoch."""
        path = self._guarded(save_checkpoint, model, self.checkpoints, f"epoch{epoch}")
        self._guarded(write_json, self.file(STATE), dict(epoch=epoch, updates=updates, checkpoint=path))

    def save_backup(self, model, epoch, batch, updates, loss_state):
        """checkpoints/backup.keras within epoch `epoch` after `batch` of its batches; state.json keeps
        the newest finished epoch and adds the backup to resume from."""
        path = self._guarded(save_checkpoint, model, self.checkpoints, "backup")
        state = self.state() or dict(epoch=0, updates=0)
        self._guarded(write_json, self.file(STATE), dict(state, backup=dict(
            epoch=epoch, batch=batch, updates=updates, checkpoint=path, loss_state=loss_state)))

    def save_step(self, model, updates, loss_state, elapsed_s):
        """checkpoints/stepN.keras, then state.json naming it, with the loss tracker's state and the time."""
        path = self._guarded(save_checkpoint, model, self.checkpoints, f"step{updates}")
        self._guarded(write_json, self.file(STATE), dict(updates=updates, checkpoint=path, loss_state=loss_state,
                                                         elapsed_s=elapsed_s))

    def _guarded(self, write, *args):
        """`write(*args)`; a WriteError it raises gets what --resume would go on from added."""
        try:
            return write(*args)
        except WriteError as error:
            raise WriteError(f"{error}; {self._what_resumes()}") from None

    def _what_resumes(self):
        state = self.state()
        if not state:
            return "nothing of this run was saved yet: make room and run the command again"
        saved = (f"update {state['backup']['updates']}" if state.get("backup") else
                 f"epoch {state['epoch']}" if "epoch" in state else f"update {state['updates']}")
        return f"{self.path} is intact up to {saved}: make room and run the same command with --resume"

    def state(self):
        """state.json's content, {} when there is none, None when it cannot be read."""
        if not holds_run(self.path):
            return {}
        try:
            with open(self.file(STATE)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def remove_partial_saves(self):
        """Remove the leftovers of interrupted checkpoint saves (".partial-*") in checkpoints/ (the chief alone)."""
        _remove_partials(self.checkpoints)


def _remove_partials(directory):
    if not is_chief() or not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if name.startswith(".partial-"):
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass


# --- config.json ---------------------------------------------------------------------------------

def run_config(settings, extra=None, setup=None):
    """What config.json records: `settings`, every field of the run's spec (`specs.TranslationSpec.config`,
    with `given`, the fields the command line or the experiment set), the backend, the versions, the command,
    and the devices and process settings of `setup` (a `devices.Setup`: processes, devices, replicas,
    distribute_mode, runtime)."""
    versions = {"python": platform.python_version()}
    for name in ("keras", "jax", "tensorflow", "torch", "numpy", "sacrebleu"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    config = dict(settings)
    config.update(code_version=code_version(), backend=os.environ.get("KERAS_BACKEND"), versions=versions,
                  command=" ".join(sys.argv),
                  **(setup.config() if setup else {}))
    config.update(extra or {})
    return config


# --- checkpoints ---------------------------------------------------------------------------------

def random_state(model):
    """What draws `model`'s dropout masks, as JSON: its generators' states. On jax and tensorflow every mask
    comes from them; on torch Keras's Dropout uses torch's own generator instead, which each update seeds
    from the run's seed and the update (`devices.seed_dropout`), so a checkpoint need not carry it."""
    return {"seed_generators": [v.numpy().tolist() for v in seed_generators(model)]}


def save_checkpoint(model, directory, name):
    """Save model and optimizer state to directory/name.keras atomically; returns the path. The archive
    also holds RANDOM_STATE (`random_state`), which Keras does not save and a resume restores.

    Several processes: the chief alone writes it. The others save into a temporary directory that is
    then removed: Keras's saving creates a variable, which under a jax distribution or a tf.distribute
    strategy is a step that every process must take (jax checks that the processes agree on its value).
    """
    path = os.path.join(directory, f"{name}.keras")
    if not is_chief():
        with tempfile.TemporaryDirectory() as scratch:
            model.save(os.path.join(scratch, f"{name}.keras"))
        return path
    tmp = os.path.join(directory, f".partial-{os.getpid()}-{name}.keras")  # Keras wants the .keras suffix
    with writing(path, tmp):
        os.makedirs(directory, exist_ok=True)
        model.save(tmp)
        with zipfile.ZipFile(tmp, "a") as archive:
            archive.writestr(RANDOM_STATE, json.dumps(random_state(model)))
        os.replace(tmp, path)
    return path


# --- which code wrote a run: the fingerprint of the code that computes numbers ------------------------------
# Which code produced a result: `code_version()`, recorded in every results.json and summary file.
#
#     code_version()  ->  {"fingerprint": "3f2a9c01d4e7", "commit": "<git HEAD or null>", "dirty": false,
#                          "measured": "2026-11-25"}
#
# The fingerprint is a hash of what can change a run's numbers: the Python source of the reproduction (the
# top-level modules and harness/, less the modules that only draw, print or explain: `NOT_NUMERIC`) and the
# shipped data under data/; not the package reproduction/, which places runs on machines and judges them.
# Comments, docstrings, blank lines and trailing spaces are left out of the hash, so a clearer comment keeps
# every result current while any change to a statement makes them stale. The Results table
# (reproduction/tables.py) compares each quoted run's fingerprint with today's and marks a row stale when they
# differ. `commit` is the git commit the working tree stood on (informational: the fingerprint decides), and
# `dirty` says whether a fingerprinted file differed from that commit. `measured` is the day the run started.
#
# Code that differs in its statements may still give the same numbers: `python reproduce.py --certify`
# (reproduction/certify.py) proves it for today's code, bit for bit, and writes the certificate into
# results/certify/certificates.json; reproduction/tables.py then counts rows measured on equivalent code as
# current.
#
# Without Keras: the tables (reproduction/tables.py) and the numerics check read it too.

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Modules of harness/ whose changes cannot move a number: figures, progress lines, messages, the package's
# map. The package reproduction/ (the experiments, their runs and processes, the tables and the numerics check)
# is outside the fingerprint altogether: no training run imports it (tests/test_module_graph.py), a run's
# settings are its spec, which its run directory records, and reproduce.py runs again any run whose spec an
# edit of the experiments changed.
NOT_NUMERIC = {"harness/__init__.py", "harness/plots.py", "harness/console.py"}
TOP_LEVEL = ("layers.py", "models.py", "schedules.py", "optimizers.py", "train_nmt.py", "pretrain_bert.py",
             "analyze_grads.py")


def numeric_files(root=ROOT, top_level=TOP_LEVEL, not_numeric=NOT_NUMERIC):
    """The files the fingerprint covers, relative to `root`, sorted (by these rules, or by another version's
    `top_level` and `not_numeric`: reproduction/certify.py reads a measured commit's)."""
    files = [name for name in top_level if os.path.exists(os.path.join(root, name))]
    files += [f"harness/{name}" for name in os.listdir(os.path.join(root, "harness")) if name.endswith(".py")]
    for folder, _, names in os.walk(os.path.join(root, "data")):
        files += [os.path.relpath(os.path.join(folder, name), root) for name in names if not name.endswith(".md")]
    return sorted(f.replace(os.sep, "/") for f in files if f.replace(os.sep, "/") not in not_numeric)


def statements_only(source):
    """Python source less its comments, docstrings, blank lines and trailing spaces."""
    return "\n".join(line for line in code_lines(source) if line)


def code_lines(source):
    """The lines of Python source as the fingerprint reads them, one for each line of `source`: without
    its comment and trailing spaces, and blank ("") for a line of a docstring."""
    tree = ast.parse(source)
    skip = set()
    for node in [tree, *ast.walk(tree)]:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            skip.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:  # a comment runs to the end of its line
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    return ["" if number in skip else line.rstrip() for number, line in enumerate(lines, 1)]


def fingerprint(root=ROOT):
    """12 hex digits of SHA-256 over `numeric_files`: each file's name, then its statements (or bytes).

    Reading the statements takes about 0.5 s, so the result is kept in the user's cache folder
    (`fingerprints_dir`) under a SHA-256 of the files' names and bytes and of this module's own: the
    same files are read once, and an edited file is read again."""
    names = numeric_files(root)
    raw, key = {}, hashlib.sha256(_OWN_BYTES)
    for name in names:
        with open(os.path.join(root, name), "rb") as f:
            raw[name] = f.read()
        key.update(name.encode("utf-8") + b"\0" + raw[name] + b"\0")
    kept = os.path.join(fingerprints_dir(), key.hexdigest())
    with contextlib.suppress(OSError, UnicodeDecodeError), open(kept) as f:
        known = f.read()
        if len(known) == 12 and all(c in "0123456789abcdef" for c in known):
            return known
    digest = hashlib.sha256()
    for name in names:
        data = statements_only(raw[name].decode("utf-8")).encode("utf-8") if name.endswith(".py") else raw[name]
        digest.update(name.encode("utf-8") + b"\0" + data + b"\0")
    value = digest.hexdigest()[:12]
    with contextlib.suppress(OSError):  # no cache folder: the next run reads the statements again
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        with open(f"{kept}.tmp{os.getpid()}", "w") as f:
            f.write(value)
        os.replace(f"{kept}.tmp{os.getpid()}", kept)
    return value


with open(__file__, "rb") as _own:
    _OWN_BYTES = _own.read()  # how `fingerprint` reads statements: a part of its cache's key


def fingerprints_dir(environ=None):
    """Where `fingerprint` keeps what it read: LNPLACE_FINGERPRINTS if set, else
    $XDG_CACHE_HOME/lnplace/fingerprints or ~/.cache/lnplace/fingerprints (one 12-byte file per state of the
    code; delete the folder to clear it)."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return environ.get("LNPLACE_FINGERPRINTS") or os.path.join(base, "lnplace", "fingerprints")


def _git(*argv, root=ROOT):
    try:
        done = subprocess.run(["git", "-C", root, *argv], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def code_version(root=ROOT):
    """{"fingerprint", "commit", "dirty", "measured"} of the code this process runs: taken at the first call,
    which the scripts make as they start (`cli.run_script`), so that a file edited while a run trains does
    not change what the run records."""
    commit = _git("rev-parse", "HEAD", root=root)
    changed = _git("status", "--porcelain", "--", *numeric_files(root), root=root) if commit else None
    return dict(fingerprint=fingerprint(root), commit=commit, dirty=bool(changed) if commit else None,
                measured=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
