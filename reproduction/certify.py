"""`python reproduce.py --certify`: proof that today's code gives, bit for bit, the numbers of the code the
Results table was measured on, so that a refactor which keeps every number keeps every row current.

    python reproduce.py --certify      # about 6 min on an idle 2-core host; 15-20 more the first time on a host

The check (`STEPS`) is 38 tiny, seeded, single-threaded runs of the three scripts, each on the backend
its rows were measured on (translation and the analyses on jax, BERT on torch), through every path a row
reads: the shipped corpora and their BPE and WordPiece vocabularies, packed batches, the three placements
(DeepNorm under both rules), Adam, RAdam and SGD, every schedule family, dropout, a resumed run,
validation loss and greedy BLEU, beam-5 test BLEU (sacreBLEU and tokenized), `--translate`, BERT's two
recipes and an MRPC fine-tuning, and each analysis of analyze_grads.py. Its outputs are every number the
runs write (results.json, metrics.csv and the analyses' tables, at full precision), every translation,
and a digest of the weights and optimizer state in every checkpoint; timings and paths are left out.

Certifying today's code against a measured fingerprint M (one the Results table's rows were measured on):

1. The canonical outputs of M: results/certify/M-HOST.json, written by running the check on M's own code
   (its commit, taken out of git, whose fingerprint must be M) on this host, once per host: kernels and
   their sums differ between CPUs, so outputs are compared on the host that recorded them. The library
   versions must be those of M's first record; another Keras, jax or torch is a re-measurement.
2. The check on today's code, each step under coverage.py.
3. It refuses, exit code 1, when (a) an output differs from M's (the first one is named), (b) a statement
   of the fingerprinted files (harness/rundir.py) that differs from M's commit never ran in the check
   (named with its file and line: a change the check cannot see cannot be certified; a `raise` is exempt,
   since a run it ends reports no number, but the test that guards it must run), or (c) a shipped data
   file differs.
4. Otherwise today's fingerprint is written into results/certify/certificates.json as equivalent to M,
   and reproduction/tables.py treats rows measured on either as current.

A certificate never stands in for re-measuring a change that moves numbers on purpose: such a change
fails (a). Without Keras: this process starts the steps and reads what they write.
"""

import csv
import datetime
import gzip
import hashlib
import importlib.util
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass

import h5py

from harness import rundir
from harness.console import UsageError
from harness.files import CONFIG
from harness.rundir import PLACEMENT
from reproduction import tables
from reproduction.certificates import (CERTIFICATES, FOLDER, JOBS, certificates, certified_as, environment, record_path,
                                      records)
from reproduction.changes import changed_since, coverage_data, coverage_rc, numeric_files, unexecuted
from reproduction.runner import Threads, drive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- the check ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One command of the check: `argv` (a script and its flags, or -m, a module and its arguments) run on
    `backend` in the tree under test.
    Its words may name folders: {out} the run directory it writes (`out`, by default its own name), {NAME}
    another step's, {small} the small corpus, {glue} the MRPC-layout pairs and {wmt14} the WMT14 archives in
    miniature (`write_inputs`); {vocab} is the vocabulary file that step bert-vocab learned. Its outputs are what
    {out} holds when it ends (`outputs_of`; with `reads`, only the files whose paths start so) and, with
    `stdout`, its standard output line by line. `job` names the rows whose paths it runs (`JOBS`); "" for a path
    that no measured row took (early stopping): run for coverage alone, its outputs neither recorded nor
    compared. With `processes` above 1 the command runs as that many processes training as one
    (docs/several-hosts.md: TF_CONFIG, or jax's JAX_* variables, on this machine); `env` ((name, value)
    pairs) sets variables over `step_env`'s; `exit` is the exit code it must end with (2: a refusal)."""

    name: str
    backend: str
    argv: tuple
    after: tuple = ()
    out: str = ""
    stdout: bool = False
    reads: tuple = ()
    job: str = "translation"
    processes: int = 1
    env: tuple = ()
    exit: int = 0

    def __post_init__(self):
        object.__setattr__(self, "after", frozenset(self.after))  # the names of the steps it waits for, as a set


def nmt(*flags):
    """train_nmt.py at the tiny size, writing {out}."""
    return ("train_nmt.py", "--preset", "tiny", "--out", "{out}") + flags


def small(*flags):
    """train_nmt.py on the small raw-text corpus (the fairseq layout of --data-dir): two epochs of about 33
    updates, validation every 8, dropout everywhere."""
    return nmt("--data-dir", "{small}", "--epochs", "2", "--eval-every", "8", "--lr", "2e-3", "--dropout", "0.1",
               "--attention-dropout", "0.1", "--activation-dropout", "0.1", "--max-len-b", "24", *flags)


def wmt14(*flags):
    """train_nmt.py --prepare-wmt14 on the miniature archives {wmt14}, into {out}/data, then two updates on it."""
    return nmt("--prepare-wmt14", "{wmt14}", "--data-dir", "{out}/data", "--src", "en", "--tgt", "de", "--max-updates",
               "2", "--warmup-updates", "1", "--beam", "1", "--max-len-b", "20", *flags)


def bert(*flags):
    """pretrain_bert.py at the tiny size on the shipped Wikipedia sample, 6 updates, writing {out}."""
    return ("pretrain_bert.py", "--preset", "tiny", "--steps", "6", "--dropout", "0.1", "--attention-dropout", "0.1",
            "--out", "{out}") + flags


# A coverage step's short run (two updates, two sentences to validate and test), and jax on two CPU devices.
TWO_UPDATES = ("--max-updates", "2", "--warmup-updates", "1", "--valid-sentences", "2", "--test-sentences", "2",
               "--beam", "1", "--max-len-b", "8")
FOUR_UPDATES = nmt("--data-dir", "{small}", "--max-updates", "4", "--eval-every", "2", "--valid-sentences", "4",
                   "--test-sentences", "4", "--beam", "1", "--max-len-b", "8")  # two processes training as one
TWO_CPU_DEVICES = (("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false --xla_force_host_platform_device_count=2"),)

STEPS = (
    # the README's main command at the tiny size: the shipped Multi30k and its BPE, Pre-LN without warmup
    # (step decay), validation every 20 updates (loss and greedy BLEU), beam-5 test BLEU; then --translate
    Step("main", "jax", nmt("--corpus", "multi30k", "--norm", "pre", "--no-warmup", "--lr", "3e-3", "--dropout", "0.1",
                            "--max-updates", "60", "--eval-every", "20", "--valid-sentences", "8",
                            "--test-sentences", "8")),
    Step("translate", "jax", ("train_nmt.py", "--translate", "{main}", "--input", "{small}/test.de"),
         after=("main",), stdout=True),
    Step("post-sgd-warmup", "jax", small("--norm", "post", "--optimizer", "sgd", "--lr", "0.05",
                                         "--schedule", "inverse_sqrt", "--warmup-updates", "4")),
    Step("post-step-nowarmup", "jax", small("--norm", "post", "--no-warmup", "--decay-epoch", "1",
                                            "--weight-decay", "1e-4", "--clip-norm", "1.0")),
    Step("deepnorm-radam-linear", "jax", small("--norm", "deepnorm", "--optimizer", "radam", "--schedule", "linear",
                                               "--no-warmup", "--encoder-layers", "2", "--decoder-layers", "2")),
    Step("deepnorm-torchscale-constant", "jax", small("--norm", "deepnorm", "--deepnorm-rule", "torchscale",
                                                      "--schedule", "constant", "--warmup-updates", "3", "--lr", "1e-3",
                                                      "--encoder-layers", "2", "--decoder-layers", "2")),
    Step("pre-decay-inverse-sqrt", "jax", small("--norm", "pre", "--no-warmup", "--schedule", "decay_then_inverse_sqrt",
                                                "--decay-epoch", "1", "--dictionaries", "separate")),
    # a run stopped after its first epoch, then resumed from its checkpoint to the second (how long runs go on)
    Step("first-epoch", "jax", small("--norm", "post", "--warmup-updates", "4", "--epochs", "1")),
    Step("resumed", "jax", small("--norm", "post", "--warmup-updates", "4", "--resume"), after=("first-epoch",),
         out="first-epoch"),
    # a sweep: its runs in processes of their own (reproduction/worker.py), two at a time, and its table
    Step("sweep", "jax", ("train_nmt.py", "--sweep", "fig2", "--preset", "tiny", "--runs",
                          "post-warmup-lr5e-4,pre-constant-lr5e-4", "--jobs", "2", "--data-dir", "{small}",
                          "--max-updates", "12", "--test-sentences", "8", "--max-len-b", "16", "--out", "{out}")),
    # BERT: the WordPiece vocabulary of the shipped Wikipedia sample (its file, ids and all: `{vocab}`),
    # Figure 5(a)'s two recipes on it, then MRPC fine-tuning of both
    Step("bert-vocab", "torch", bert("--max-updates", "1"), reads=("vocab/",), job="bert"),
    Step("bert-post-warmup", "torch", bert("--recipe", "post-warmup", "--vocab", "{vocab}"),
         after=("bert-vocab",), job="bert"),
    Step("bert-pre-no-warmup", "torch", bert("--recipe", "pre-no-warmup", "--vocab", "{vocab}"),
         after=("bert-vocab",), job="bert"),
    Step("finetune-mrpc", "torch", ("pretrain_bert.py", "--preset", "tiny", "--finetune", "mrpc", "--glue-dir",
                                    "{glue}", "--init", "{bert-post-warmup}", "{bert-pre-no-warmup}", "--seeds", "2",
                                    "--epochs", "1", "--out", "{out}"),
         after=("bert-post-warmup", "bert-pre-no-warmup"), job="bert"),
    # every analysis of analyze_grads.py, on the shipped Multi30k's sentences
    Step("analysis", "jax", ("analyze_grads.py", "all", "--preset", "tiny", "--out", "{out}"), job="analysis"),
    # paths no measured row took, run for coverage alone (job ""): early stopping (the converged protocol)
    # with mid-epoch backups,
    # --eval-only of a run folder, --translate of a checkpoint, the WMT14 preparation with either validation set,
    # a refusal after the run folder was claimed (a bad KERAS_BACKEND: nothing is left),
    # --benchmark, the analyses' list flags and random token ids, BERT pretraining stopped and resumed, two
    # processes training as one, on tensorflow (MultiWorkerMirroredStrategy) and on jax, the main command's
    # own preset (cpu) for two updates, two devices in one process (data and model parallel, jax), the
    # synthetic corpus (reproduce.py --smoke's), the IWSLT14 preparation on a miniature release and --translate of
    # its run (Moses tokenization and BPE on raw text), runs in
    # processes of their own (reproduction/worker.py): a sweep of Figure 5(a)'s two recipes, MRPC fine-tuning and
    # an analysis as reproduce.py starts them; and reproduce.py --smoke of the quick rows, which runs,
    # publishes and judges them
    Step("plateau", "jax", small("--norm", "pre", "--no-warmup", "--patience", "2", "--min-delta", "100",
                                 "--decay-epoch", "1", "--backup-every", "5"), job=""),  # stops after its step
    Step("eval-only", "jax", ("train_nmt.py", "--eval-only", "{main}", "--beam", "1"), after=("main",), job=""),
    Step("translate-checkpoint", "jax", ("train_nmt.py", "--translate", "{main}/checkpoints/epoch1.keras", "--input",
                                         "{small}/test.de", "--beam", "1"), after=("main",), job=""),
    Step("wmt14-split", "jax", wmt14("--wmt14-valid", "split"), job=""),
    Step("wmt14-newstest2013", "jax", wmt14("--wmt14-valid", "newstest2013"), job=""),
    Step("refused-backend", "jax", nmt("--data-dir", "{small}"), env=(("KERAS_BACKEND", "nonsense"),), exit=2, job=""),
    Step("benchmark", "jax", ("train_nmt.py", "--benchmark", "1", "--preset", "tiny", "--benchmark-sentences", "4"),
         job=""),
    Step("analysis-depths", "jax", ("analyze_grads.py", "fig3-depth", "--preset", "tiny", "--depths", "1,2",
                                    "--random-tokens", "--out", "{out}"), job=""),
    Step("analysis-norms", "jax", ("analyze_grads.py", "fig3-layers", "--preset", "tiny", "--norms", "post,pre",
                                   "--data-dir", "{small}", "--out", "{out}"), job=""),
    Step("two-workers", "tensorflow", FOUR_UPDATES, processes=2, job=""),
    Step("two-processes", "jax", FOUR_UPDATES, processes=2, job=""),
    Step("cpu-preset", "jax", ("train_nmt.py", "--out", "{out}", *TWO_UPDATES), job=""),
    Step("two-devices", "jax", nmt("--data-dir", "{small}", *TWO_UPDATES), env=TWO_CPU_DEVICES, job=""),
    Step("model-parallel", "jax", nmt("--data-dir", "{small}", "--distribute", "model", "--model-parallel", "2",
                                      *TWO_UPDATES), env=TWO_CPU_DEVICES, job=""),
    Step("iwslt14-prepare", "jax", nmt("--prepare-iwslt14", "{iwslt14}/de-en.tgz", "--data-dir", "{out}/data",
                                       *TWO_UPDATES), job=""),
    Step("iwslt14-translate", "jax", ("train_nmt.py", "--translate", "{iwslt14-prepare}", "--input", "{small}/test.de",
                                      "--beam", "1", "--max-len-b", "8"), after=("iwslt14-prepare",), job=""),
    Step("synthetic", "jax", nmt("--corpus", "synthetic", *TWO_UPDATES), job=""),
    Step("bert-sweep", "torch", ("pretrain_bert.py", "--sweep", "fig5", "--preset", "tiny", "--steps", "2",
                                 "--warmup-updates", "1", "--out", "{out}"), job=""),
    Step("finetune-worker", "torch", ("-m", "reproduction.worker", "finetune", "{out}",
                                      '{{"finetune": "mrpc", "glue_dir": "{glue}", "init": ["@{bert-post-warmup}"], '
                                      '"preset": "tiny", "seeds": 1, "epochs": 1, "out": "{out}"}}'),
         after=("bert-post-warmup",), job=""),
    Step("analysis-worker", "jax", ("-m", "reproduction.worker", "analysis", "{out}",
                                    '{{"analysis": "lemma2", "preset": "tiny", "out": "{out}"}}'), job=""),
    Step("reproduce-smoke", "jax", ("reproduce.py", "--smoke", "--only", "main,analysis", "--runs-dir", "{out}"),
         job=""),
    Step("bert-stopped", "torch", bert("--recipe", "pre-no-warmup", "--vocab", "{vocab}", "--max-updates", "3"),
         after=("bert-vocab",), job=""),
    Step("bert-resumed", "torch", bert("--recipe", "pre-no-warmup", "--vocab", "{vocab}", "--resume"),
         after=("bert-stopped",), out="bert-stopped", job=""),
    Step("bert-plateau", "torch", bert("--recipe", "pre-no-warmup", "--vocab", "{vocab}", "--patience", "1",
                                       "--min-delta", "100"), after=("bert-vocab",), job=""),
)


# --- the inputs the steps read --------------------------------------------------------------------------

SMALL_PAIRS = {"train": 160, "valid": 16, "test": 16}  # the first pairs of each split of the shipped Multi30k
MULTI30K = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
WMT14_ARCHIVES = (  # (archive, member for each language, the split of {small} it holds): harness/wmt14.py's names
    ("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en.{lang}", "train"),
    ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en.{lang}", "train"),
    ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.de-en.{lang}", "train"),
    ("test-full.tgz", "test-full/newstest2014-deen-{side}.{lang}.sgm", "test"),
    ("dev.tgz", "dev/newstest2013.{lang}", "valid"),
)


def write_inputs(tree, work):
    """{small}: the small corpus in the fairseq layout ({train,valid,test}.{de,en}), from the tree's own
    data/multi30k; {glue}: MRPC-layout pairs made of its English training sentences (a sentence with itself
    is a paraphrase, with the next one not); {wmt14}: `write_wmt14`'s archives; {iwslt14}: `write_iwslt14`'s.
    Returns {word: folder}."""
    folders = {word: os.path.join(work, word) for word in ("small", "glue", "wmt14", "iwslt14")}
    for folder in folders.values():
        os.makedirs(folder, exist_ok=True)
    english = []
    for split, stem in MULTI30K.items():
        for lang in ("de", "en"):
            with gzip.open(os.path.join(tree, "data", "multi30k", f"{stem}.{lang}.gz"), "rt", encoding="utf-8") as f:
                lines = [f.readline().strip() for _ in range(SMALL_PAIRS[split])]
            with open(os.path.join(folders["small"], f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            english += lines if (split, lang) == ("train", "en") else []
    rows = [(1, a, a) if i % 2 else (0, a, b) for i, (a, b) in enumerate(zip(english, english[1:]))]
    for split, part in (("train", rows[:96]), ("dev", rows[96:128])):
        with open(os.path.join(folders["glue"], f"{split}.tsv"), "w", encoding="utf-8") as f:
            f.write("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n")
            f.writelines(f"{label}\t{i}\t{i + 1}\t{a}\t{b}\n" for i, (label, a, b) in enumerate(part))
    write_wmt14(folders["small"], folders["wmt14"])
    write_iwslt14(folders["small"], folders["iwslt14"])
    return folders


def write_wmt14(small, folder):
    """The WMT14 archives that harness/wmt14.py reads, in miniature, in `folder`: each training corpus holds the
    small corpus's training pairs (English and German), newstest2014 (SGML) its test pairs and newstest2013 its
    validation pairs."""
    for archive, member, split in WMT14_ARCHIVES:
        with tarfile.open(os.path.join(folder, archive), "w:gz") as tar:
            for lang, side in (("en", "src"), ("de", "ref")):
                with open(os.path.join(small, f"{split}.{lang}"), encoding="utf-8") as f:
                    lines = f.read().splitlines()
                if member.endswith(".sgm"):
                    lines = [f'<seg id="{number}">{line}</seg>' for number, line in enumerate(lines, 1)]
                data = "".join(line + "\n" for line in lines).encode("utf-8")
                info = tarfile.TarInfo(member.format(lang=lang, side=side))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


IWSLT14_TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
                     "IWSLT14.TED.tst2012")  # harness/iwslt14.py's TEST_SETS


def write_iwslt14(small, folder):
    """The IWSLT14 release that harness/iwslt14.py reads, de-en.tgz, in miniature in `folder`: its train.tags
    hold the small corpus's training pairs, and its five dev and test sets (XML) share the test pairs."""
    with tarfile.open(os.path.join(folder, "de-en.tgz"), "w:gz") as tar:
        for lang in ("de", "en"):
            lines = {}
            for split in ("train", "test"):
                with open(os.path.join(small, f"{split}.{lang}"), encoding="utf-8") as f:
                    lines[split] = f.read().splitlines()
            members = {f"de-en/train.tags.de-en.{lang}": lines["train"]}
            for index, name in enumerate(IWSLT14_TEST_SETS):
                segs = lines["test"][index::len(IWSLT14_TEST_SETS)]
                members[f"de-en/{name}.de-en.{lang}.xml"] = [f'<seg id="{n}"> {seg} </seg>' for n, seg in
                                                             enumerate(segs, 1)]
            for member, text in members.items():
                data = "".join(line + "\n" for line in text).encode("utf-8")
                info = tarfile.TarInfo(member)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


# --- running the check ------------------------------------------------------------------------------------

def step_env(backend):
    """The environment of a step: its backend, one kernel thread, no GPU, nothing inherited that could
    change a number (XLA flags, a chosen jax platform)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("XLA_", "JAX_", "KERAS_", "TF_", "OMP_"))}
    return dict(env, KERAS_BACKEND=backend, OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1",
                TF_NUM_INTEROP_THREADS="1", XLA_FLAGS="--xla_cpu_multi_thread_eigen=false", CUDA_VISIBLE_DEVICES="",
                JAX_PLATFORMS="cpu", PYTHONDONTWRITEBYTECODE="1")


def process_envs(step):
    """The environment of each process of `step`: `step_env`'s, and with several processes the variables that
    join them (TF_CONFIG's workers, or jax's coordinator), on ports free on this machine."""
    env = dict(step_env(step.backend), **dict(step.env))
    if step.processes == 1:
        return [env]
    sockets = [socket.socket() for _ in range(step.processes)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    if step.backend == "jax":
        return [dict(env, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{ports[0]}", JAX_NUM_PROCESSES=str(step.processes),
                     JAX_PROCESS_ID=str(i)) for i in range(step.processes)]
    workers = [f"127.0.0.1:{port}" for port in ports]
    return [dict(env, TF_CONFIG=json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}))
            for i in range(step.processes)]


def command(step, tree, work, folders, coverage_rc=None):
    """The argv of `step`, its folder words filled in."""
    words = {**{s.name: run_folder(work, s) for s in STEPS}, **folders, "out": run_folder(work, step)}  # inputs first
    if any("{vocab}" in word for word in step.argv):
        words["vocab"] = learned_vocab(run_folder(work, "bert-vocab"))
    argv = [word.format(**words) for word in step.argv]
    if argv[0] != "-m":  # a script of the tree; a module (-m NAME) is found from the tree, the steps' folder
        argv[0] = os.path.join(tree, argv[0])
    python = [sys.executable, "-m", "coverage", "run", f"--rcfile={coverage_rc}"] if coverage_rc else [sys.executable]
    return python + argv


def run_folder(work, step):
    """The run directory a step (or a step's name) writes."""
    if isinstance(step, str):
        step = next(s for s in STEPS if s.name == step)
    return os.path.join(work, "runs", step.out or step.name)


def wordpiece_files(folder):
    return sorted(os.path.join(folder, "vocab", name) for name in os.listdir(os.path.join(folder, "vocab"))
                  if name.startswith("wordpiece-") and name.endswith(".json"))


def learned_vocab(run):
    """The WordPiece vocabulary file that the run directory `run` learned."""
    found = wordpiece_files(run)
    if len(found) != 1:
        raise CheckError(f"{run}/vocab holds {len(found)} WordPiece files, not one")
    return found[0]


class CheckError(Exception):
    """The check could not run as it should (a step failed, an input is missing): one line."""


def run_check(tree, work, steps=STEPS, coverage_rc=None, jobs=2, say=print):
    """Run `steps` in `tree`, `jobs` at a time in the order given (as far as their `after` allow), their
    folders under `work`; returns the outputs {key: value}, in the steps' order."""
    folders = write_inputs(tree, work)
    logs = os.path.join(work, "logs")
    os.makedirs(logs, exist_ok=True)
    done = {}

    def run(step):
        started = datetime.datetime.now()
        argv = command(step, tree, work, folders, coverage_rc)
        with open(os.path.join(logs, f"{step.name}.log"), "wb") as log:
            # the check's own fingerprint cache, so that its first run reads the statements and the others load them
            started_processes = [subprocess.Popen(argv, cwd=tree, stdout=subprocess.PIPE, stderr=log,
                                                  env=dict(env, LNPLACE_FINGERPRINTS=os.path.join(work, "fingerprints")))
                                 for env in process_envs(step)]
            stdout = [process.communicate()[0] for process in started_processes][0]  # the chief's
        code = max(abs(process.returncode) for process in started_processes)
        if code != step.exit:
            with open(os.path.join(logs, f"{step.name}.log"), encoding="utf-8", errors="replace") as log:
                last = [line for line in log.read().splitlines() if line.strip()][-1:] or ["(no output)"]
            raise CheckError(f"step {step.name} failed (exit code {code}): {last[0].strip()}")
        out = run_folder(work, step)
        found = outputs_of(step.name, out, stdout.decode("utf-8") if step.stdout else None, (work, tree), step.reads)
        say(f"  {step.name}: {len(found)} outputs, {(datetime.datetime.now() - started).total_seconds():.0f} s")
        return found

    def take(step, found):
        done[step.name] = found  # a step that failed raised its CheckError instead, which ends the check

    engine = Threads(run, jobs)
    try:  # the runner's one loop (reproduction/runner.py), the steps on threads of this process
        drive(engine, lambda running, failed: [s for s in steps if s.name not in done and s not in running.values()],
              lambda step: jobs, take)
    finally:
        engine.close()
    return {key: value for step in steps if step.name in done for key, value in done[step.name].items()}


# --- what a step wrote ----------------------------------------------------------------------------------------

# Left out of the outputs: what depends on the clock, the host or the paths, not on the code's numbers.
VOLATILE = {"out", "minutes", "train_minutes", "elapsed_s", "seconds", "tokens_per_s", "sentences_per_s",
            "test_sentences_per_s", "compile_s", "compile_share", "compile_programs", "code_version", "measured",
            "commit", "fingerprint", "dirty"}
# Not read: config.json (the settings as the spec writes them, not numbers: a refactor may lay them out anew)
# and placement.json (where each start of a run ran, reproduction/runner.py).
NOT_READ = {CONFIG, PLACEMENT}


def outputs_of(step, folder, stdout, paths, reads=()):
    """{key: value} of what `folder` holds: each number and string of its JSON and CSV files (less
    `VOLATILE`), a digest of each checkpoint's arrays and each vocabulary file's bytes, and `stdout`'s lines.
    Keys read STEP/FILE:FIELD; values are text, numbers at full precision; `paths` are written as <work>
    and <tree>."""
    found = {}
    files = sorted(os.path.relpath(os.path.join(d, n), folder).replace(os.sep, "/")
                   for d, _, names in os.walk(folder) for n in names)
    for name in files:
        path = os.path.join(folder, name)
        base = os.path.basename(name)
        if base in NOT_READ or (reads and not name.startswith(reads)):
            continue
        if name.startswith("vocab/"):  # its bytes: the pieces and their ids
            with open(path, "rb") as f:
                found[f"{step}/{name}"] = hashlib.sha256(f.read()).hexdigest()
        elif base.endswith(".json"):
            with open(path, encoding="utf-8") as f:
                _flatten(json.load(f), f"{step}/{name}:", found)
        elif base.endswith(".csv"):
            with open(path, encoding="utf-8", newline="") as f:
                for number, row in enumerate(csv.DictReader(f)):
                    _flatten(row, f"{step}/{name}:{number}.", found)
        elif base.endswith(".keras"):
            found[f"{step}/{name}"] = weights_digest(path)
    for number, line in enumerate((stdout or "").splitlines() if stdout is not None else []):
        found[f"{step}/stdout:{number}"] = line
    return {key: _plain(value, paths) for key, value in found.items()}


def _flatten(value, key, found):
    if isinstance(value, dict):
        for name, item in value.items():
            if name not in VOLATILE:
                _flatten(item, f"{key}{name}." if isinstance(item, (dict, list)) else f"{key}{name}", found)
    elif isinstance(value, list):
        for number, item in enumerate(value):
            _flatten(item, f"{key}{number}." if isinstance(item, (dict, list)) else f"{key}{number}", found)
    else:
        found[key.rstrip(".")] = value


def _plain(value, paths):
    """A value as the record keeps it: text, with the check's own folders named, not spelt out."""
    text = value if isinstance(value, str) else json.dumps(value)
    for path, word in zip(paths, ("<work>", "<tree>")):
        text = text.replace(os.path.realpath(path), word).replace(path, word)
    return text


def weights_digest(path):
    """SHA-256 over the arrays of a .keras file's weights (model and optimizer state), each as dtype, shape
    and bytes, in sorted order: the same numbers give the same digest whatever the layers are named."""
    with zipfile.ZipFile(path) as archive:
        data = archive.read("model.weights.h5")
    arrays = []
    with h5py.File(io.BytesIO(data), "r") as f:
        def visit(_, item):
            if isinstance(item, h5py.Dataset):
                value = item[()]
                arrays.append(hashlib.sha256(f"{value.dtype.str}{value.shape}".encode() + value.tobytes()).hexdigest())
        f.visititems(visit)
    return f"{len(arrays)} arrays " + hashlib.sha256("".join(sorted(arrays)).encode()).hexdigest()


def digest(outputs):
    """The hash of the whole: SHA-256 of the outputs as sorted JSON."""
    return hashlib.sha256(json.dumps(outputs, sort_keys=True).encode("utf-8")).hexdigest()


def measured_fingerprints(root):
    """{job: the code fingerprints its rows of the Results table were measured on} (as `root`'s
    reproduction/tables.py reads them)."""
    found = {}
    for row in tables.results_rows(root):
        found.setdefault(row.job, set()).update(fp for fp in row.found if fp)
    return found


def _git(root, *argv, binary=False):
    try:
        done = subprocess.run(["git", "-C", root, *argv], capture_output=True)
    except OSError:  # no git
        return None
    if done.returncode != 0:
        return None
    return done.stdout if binary else done.stdout.decode("utf-8").strip()


def measured_commits(root, fingerprint):
    """The commits of this clone that may hold the code of `fingerprint`, most likely first: the one its records
    name; else those the result files record with it (code_version.commit), newest first, and after a commit
    whose working tree was measured with changes (dirty), the commits that followed it, which committed them."""
    named = [r["commit"] for r in records(root, fingerprint)]
    if named:
        return named
    clean, dirty = set(), set()
    for folder, _, names in os.walk(os.path.join(root, "results")):
        for name in names:
            if name.endswith(".json"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    text = f.read()
                if fingerprint in text:
                    _commits(json.loads(text), fingerprint, clean, dirty)
    dated = sorted(((_git(root, "log", "-1", "--format=%ct", commit) or "", commit) for commit in clean), reverse=True)
    found = [commit for date, commit in dated if date]
    for commit in sorted(dirty):
        found += (_git(root, "rev-list", "--reverse", f"{commit}..HEAD") or "").split()
    return list(dict.fromkeys(found))


def measured_commit(root, fingerprint, folder):
    """A commit of this clone whose code has `fingerprint`, its files checked out into `folder` (`checkout`)."""
    tried = measured_commits(root, fingerprint)
    for number, commit in enumerate(tried[:50]):
        tree = os.path.join(folder, f"try{number}")
        known = _git(root, "cat-file", "-e", f"{commit}^{{commit}}") is not None
        if known and checkout(root, commit, tree) == fingerprint:
            return commit, tree
    raise UsageError(f"no commit of code {fingerprint} is in this clone's history"
                     + (f" (tried {', '.join(c[:12] for c in tried[:50])})" if tried else "")
                     + ": certify in a full clone (git fetch --unshallow)")


def _commits(data, fingerprint, clean, dirty):
    """The commits the code_version entries in `data` record with `fingerprint`, into `clean` or `dirty`."""
    if isinstance(data, dict):
        version = data.get("code_version")
        if isinstance(version, dict) and version.get("fingerprint") == fingerprint and version.get("commit"):
            (dirty if version.get("dirty") else clean).add(version["commit"])
        for value in data.values():
            _commits(value, fingerprint, clean, dirty)
    elif isinstance(data, list):
        for value in data:
            _commits(value, fingerprint, clean, dirty)


OWN_FINGERPRINT = ("try:\n    from harness.rundir import fingerprint\nexcept ImportError:  # older trees\n"
                   "    from harness.provenance import fingerprint\nprint(fingerprint())")


def checkout(root, commit, folder):
    """The files of `commit` (git archive) in `folder`; returns the fingerprint that tree gives itself
    (its own harness/rundir.py's, harness/provenance.py's in older trees)."""
    data = _git(root, "archive", "--format=tar", commit, binary=True)
    if data is None:
        raise UsageError(f"git archive {commit} failed in {root}")
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        archive.extractall(folder, filter="data")
    done = subprocess.run([sys.executable, "-c", OWN_FINGERPRINT],
                          cwd=folder, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=folder))
    return done.stdout.strip()


def record(root, fingerprint, work, say=print, steps=STEPS, commit=None):
    """Run the check (`steps`) on the code of `fingerprint` (`commit`, by default `measured_commit`'s, out
    of git) and write its outputs as this host's record (results/certify/FINGERPRINT-HOST.json); returns
    the record."""
    env = environment()
    earlier = records(root, fingerprint)
    if earlier and earlier[0]["libraries"] != env["libraries"]:
        first = earlier[0]["libraries"]
        other = ", ".join(f"{name} {env['libraries'][name]} (recorded {first.get(name)})" for name in first
                          if first.get(name) != env["libraries"].get(name))
        raise UsageError(f"the outputs of code {fingerprint} were first recorded with other libraries than these: "
                         f"{other}; certify with requirements.txt's versions")
    if commit:
        tree = os.path.join(work, "tree")
        got = checkout(root, commit, tree)
        if got != fingerprint:
            raise UsageError(f"commit {commit[:12]} gives code {got or '(none)'}, not {fingerprint}")
    else:
        commit, tree = measured_commit(root, fingerprint, work)
    say(f"recording the outputs of code {fingerprint} (commit {commit[:12]}) on this host: {env['host']}")
    steps = [step for step in steps if step.job]  # the others ran no measured row: nothing to compare
    outputs = run_check(tree, os.path.join(work, "record"), steps, say=say)
    made = dict(fingerprint=fingerprint, commit=commit, recorded=_now(), host=env["host"], python=env["python"],
                libraries=env["libraries"], steps=[s.name for s in steps], hash=digest(outputs), outputs=outputs)
    path = record_path(root, fingerprint, env["key"])
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _write_json(path, made)
    say(f"wrote {os.path.relpath(path, root)}: {len(outputs)} outputs, hash {made['hash'][:16]}")
    return made


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")


def _write_json(path, data):
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=os.path.dirname(path), delete=False) as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.chmod(f.name, 0o644)
    os.replace(f.name, path)


class Refused(Exception):
    """The check found a change it cannot certify: the message says which."""


def certify(root=ROOT, steps=STEPS, work=None, say=print, write=True, against=None):
    """Certify the code in `root`, job by job (`JOBS`), against the fingerprints the Results table's rows of
    each job were measured on (`against`: one fingerprint for every job). Returns the certificate written
    (with `refused`, {job: why} for the jobs whose outputs moved), or None when every row was measured on
    today's code or code certified equivalent to it; raises Refused when no job can be certified, a changed
    statement never ran or data changed, UsageError when it cannot run."""
    for module in ("torch", "jax"):
        if importlib.util.find_spec(module) is None:
            raise UsageError(f"--certify runs its steps on jax and on torch: install {module} "
                             "(pip install -r requirements.txt, and torch as the README's Backends section says)")
    today = rundir.fingerprint(root)
    held = certificates(root)
    if against:
        targets = {job: against for job in JOBS}
    else:
        targets = {}
        for job, found in measured_fingerprints(root).items():
            other = {certified_as(fp, root, job) for fp in found} - {certified_as(today, root, job)}
            if len(other) > 1:
                raise UsageError(f"the {job} rows were measured on codes {', '.join(sorted(other))}, which no "
                                 "certificate makes equivalent: re-measure the rows of all but one")
            targets.update({job: other.pop()} if other else {})
    targets = {job: fp for job, fp in targets.items() if any(step.job == job for step in steps)}
    if not targets:
        say(f"nothing to certify: the Results table was measured on today's code ({today}) or code certified to "
            "give its numbers")
        return None
    with tempfile.TemporaryDirectory(prefix="certify-") as scratch:
        work = work or scratch
        env = environment()
        expected = {}
        for fp in sorted(set(targets.values())):
            found = [r for r in records(root, fp) if r["host"] == env["host"]]
            expected[fp] = found[0] if found else record(root, fp, os.path.join(work, fp), say, steps)
            lacking = [s.name for s in steps if s.job and s.name not in expected[fp]["steps"]]
            if lacking:
                raise UsageError(f"the record of code {fp} on this host lacks steps of today's check "
                                 f"({', '.join(lacking)}); delete "
                                 f"{os.path.relpath(record_path(root, fp, env['key']), root)} to record it again")
        say(f"the check on today's code ({today}), each step under coverage.py:")
        today_work = os.path.join(work, "today")
        outputs = run_check(root, today_work, steps, coverage_rc(root, today_work), say=say)
        executed = coverage_data(today_work)
        for fp, made in expected.items():
            check_changes(root, fp, made, executed, os.path.join(work, fp, "tree"))
        refused = {job: moved(fp, expected[fp]["outputs"], outputs, [s for s in steps if s.job == job])
                   for job, fp in targets.items()}
        refused = {job: why for job, why in refused.items() if why}
    if len(refused) == len(targets):
        raise Refused("; ".join(refused.values()))
    certified = {job: fp for job, fp in targets.items() if job not in refused}
    jobs = {**{job: certified_as(today, root, job) for job in JOBS if job not in targets}, **certified}
    dirty = bool(_git(root, "status", "--porcelain", "--", *sorted(numeric_files(root))))
    certificate = dict(jobs=jobs, certified=_now(), commit=_git(root, "rev-parse", "HEAD"), dirty=dirty,
                       host=env["host"], outputs=len(outputs), hash=digest(outputs))
    if write:
        held[today] = certificate
        os.makedirs(os.path.join(root, FOLDER), exist_ok=True)
        _write_json(os.path.join(root, CERTIFICATES), held)
    return dict(certificate, fingerprint=today, refused=refused)


def moved(fingerprint, recorded, outputs, steps):
    """Why today's `outputs` of `steps` are not those `recorded` for code `fingerprint` (the first that differs,
    or one that is missing), or None when they are, bit for bit."""
    names = {step.name for step in steps}
    for key, now in outputs.items():  # only keys the record has: an output new today cannot have moved an old number
        if key.split("/")[0] in names and key in recorded and recorded[key] != now:
            return (f"an output differs from code {fingerprint}'s: {key} was {_short(recorded[key])}, is now "
                    f"{_short(now)}")
    lost = next((key for key in recorded if key.split("/")[0] in names and key not in outputs), None)
    return f"an output of code {fingerprint} is missing today: {lost}" if lost else None


def check_changes(root, fingerprint, made, executed, tree):
    """Refuse (`Refused`) when a shipped data file differs from code `fingerprint`'s (its record `made`), or a
    statement changed since its commit never ran in the check (`executed`, coverage data); `tree` gets that
    commit's files."""
    if not os.path.isdir(tree):
        os.makedirs(tree)
        checkout(root, made["commit"], tree)
    changed, data = changed_since(tree, root)
    if data:
        raise Refused(f"shipped data differ from code {fingerprint}'s: {', '.join(data)}; a change of data is "
                      "re-measured, not certified")
    missed = unexecuted(changed, root, executed)
    if missed:
        shown = "; ".join(f"{name}:{line} {_short(text, 60)}" for name, line, text in missed[:8])
        raise Refused(f"{len(missed)} statement{'s' if len(missed) > 1 else ''} changed since commit "
                      f"{made['commit'][:12]} never ran in the check, so the check cannot see "
                      f"{'them' if len(missed) > 1 else 'it'}: {shown}" + (" ..." if len(missed) > 8 else ""))


def _short(text, width=80):
    text = str(text)
    return text if len(text) <= width else text[: width - 3] + "..."
