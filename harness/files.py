"""Writing files without Keras: atomically, as JSON or CSV, into a directory checked first.

    prepare_out_dir("runs/sweep")                      # created and writable, or a UsageError naming it
    write_json("runs/sweep/summary.json", table)        # never half-written (write_atomic)
    write_csv(path, rows); rows = read_csv(path)
    lines = read_lines("data/multi30k/train.de.gz")      # a text file's lines, or a DataError saying why not

A write that fails for want of space (or any other OSError) raises `console.WriteError`: one line saying
what could not be written where, and that `--resume` goes on once there is room (exit code 4). Only the
chief of several processes writes (`chief.is_chief`); on the others these functions do nothing.
The files of a training run, and what they mean, belong to `rundir.RunDir`.
"""

import bz2
import csv
import fcntl
import gzip
import io
import json
import math
import os

import numpy as np

from harness.console import DataError, UsageError, WriteError


# --- which process of a run this is: process 0, the chief, alone writes the run's files ----------------
# One process unless several train as one (harness/processes.py joins them and sets `PROCESS`).

PROCESS = dict(count=1, index=0)  # set when processes.join() joins several processes


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


# --- checkpoints: what rundir.py saves into each .keras archive beside Keras's own, and checkpoints.py restores

RANDOM_STATE = "random_state.json"  # an entry of each .keras checkpoint: what draws the dropout masks


def seed_generators(model):
    """The variables of `model`'s random generators, in its variable order: each Dropout's SeedGenerator state
    [seed, draws so far], the variables a model holds beyond its weights. Keras's .keras format does not
    save them, so a model loaded from a checkpoint would start its generators again."""
    weights = {id(v) for v in model.weights}
    return [v for v in model.non_trainable_variables if id(v) not in weights]
