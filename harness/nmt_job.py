"""The translation job's Keras side: what train_nmt.py's `train` calls, each function named for what it does.

    corpus, vocab, data = load_data(spec.data, spec.seed, vocab_dir)      # corpus, dictionaries, encoded splits
    plan = Plan(spec.data, spec.training, spec.optimization, data, "packed")   # updates, schedule, loss, batches
    model, start = start_model(spec.resume, spec.model, spec.optimization, run_dir, setup, plan, vocab)
    scores = test(model, corpus, vocab, data["test"], spec.data, spec.decoding)  # test BLEU

Each takes the parts of a `specs.TranslationSpec` it uses (`spec.data`, `spec.model`, `spec.optimization`,
`spec.training`, `spec.decoding`), never the spec whole, and changes none. train_nmt.py imports this module
once run_script has checked KERAS_BACKEND. docs/translation.md describes a run's files.
"""

import math
import os
import time

import keras
import numpy as np

from harness import devices, nmt_data
from harness.backend import loss_and_gradients, lr_at
from harness.callbacks import (
    Counter,
    Divergence,
    EpochCheckpoint,
    Plateau,
    ProgressLog,
    StepBackup,
    Validation,
    fit,
)
from harness.checkpoints import ResumePoint, resume_point
from harness.constants import QKV_INITS
from harness.decoding import bleu_scores, references, translate
from harness.errors import UsageError, check_warmup
from harness.files import is_finite
from harness.progress import Progress
from harness.specs import decoding_summary, length_rules
from models import LabelSmoothedCrossEntropy, TranslationTransformer
from optimizers import make_optimizer
from schedules import make_schedule


# --- data -----------------------------------------------------------------------------------------

def load_data(data, seed, vocab_dir, dictionaries=None):
    """Corpus, `nmt_data.Dictionaries` (`dictionaries`, default the data part's: joint or separate) and
    encoded splits of the spec's data part `data`, the corpus shuffled by `seed`; prints what was loaded."""
    corpus = nmt_data.load_corpus(data.data_dir, data.src, data.tgt, seed=seed, corpus=data.corpus)
    train = corpus.splits["train"]
    vocab_size, note = vocabulary_size(data, corpus)
    vocab = nmt_data.build_dictionaries(train, vocab_size, vocab_dir, corpus.bpe_split,
                                        dictionaries or data.dictionaries)
    # Training drops over-long pairs; valid and test keep every pair (truncated), aligned with the references.
    encoded = {split: nmt_data.encode_pairs(pairs, vocab, drop_long=split == "train")
               for split, pairs in corpus.splits.items()}
    if not encoded["train"]:
        raise UsageError(f"{corpus.name}: no training pair fits in {nmt_data.BUCKETS[-1]} tokens")
    print(f"data: {corpus.description}: " + ", ".join(f"{k} {len(v)}" for k, v in corpus.splits.items())
          + (f"; vocabulary {vocab.target.size}" if vocab.joint else
             f"; vocabularies {vocab.source.size} ({data.src}) and {vocab.target.size} ({data.tgt})")
          + (f" ({note})" if note else ""))
    return corpus, vocab, encoded


def vocabulary_size(data, corpus):
    """(size to ask `nmt_data.build_vocabulary` for, a note saying why it is not --vocab-size), for the
    spec's data part `data`.

    BPE-split text (IWSLT14 as fairseq prepares it) keeps every token type, as fairseq-preprocess does;
    only a --vocab-size given on the command line caps it. Raw text gets a BPE learned here: at most
    --vocab-size pieces, and a quarter of the corpus's distinct words (at least 256) when that is
    fewer, so that a small corpus is not split into pieces it has seen once.
    """
    words = {w for pair in corpus.splits["train"] for side in pair for w in side.split()}
    if corpus.bpe_split:
        if "vocab_size" not in data.given:
            return None, f"every token type of the BPE-split training text; --vocab-size {data.vocab_size} not applied"
        dropped = max(0, len(words) - (data.vocab_size - 3))
        return data.vocab_size, (f"--vocab-size {data.vocab_size} keeps the most frequent types; {dropped} of the "
                                 f"{len(words)} types become <unk>" if dropped else "")
    cap = max(256, len(words) // 4)
    if cap < data.vocab_size:
        return cap, (f"asked {data.vocab_size}, capped at {cap}: a quarter of the {len(words)} distinct training "
                     "words")
    return data.vocab_size, ""


# --- model ----------------------------------------------------------------------------------------

def build_model(settings, vocab):
    """The TranslationTransformer of the spec's model part `settings` for `vocab` (`nmt_data.Dictionaries`)."""
    model = TranslationTransformer(
        vocab.target.size, source_vocab_size=None if vocab.joint else vocab.source.size, d_model=settings.d_model,
        ffn_dim=settings.ffn_dim, num_heads=settings.heads, encoder_layers=settings.encoder_layers,
        decoder_layers=settings.decoder_layers, norm=settings.norm, deepnorm_rule=settings.deepnorm_rule,
        dropout=settings.dropout, attention_dropout=settings.attention_dropout,
        activation_dropout=settings.activation_dropout, pad_id=nmt_data.PAD, qkv_gain=QKV_INITS[settings.qkv_init])
    model.build()
    return model


# --- training -------------------------------------------------------------------------------------

def evaluate_loss(model, batches, setup):
    """Token-weighted mean validation loss."""
    total, count = 0.0, 0
    for inputs, labels in batches:
        n = int((labels != nmt_data.PAD).sum())
        total += float(np.asarray(model.test_on_batch(*setup.pad((inputs, labels))))) * n  # whole batch per replica
        count += n
    return total / max(count, 1)


def gradient_norm(model, loss, batch):
    """Global gradient norm on a fixed training batch (dropout off): how steep the model stands."""
    inputs, labels = batch
    _, grads = loss_and_gradients(model, loss, inputs, labels)
    return float(math.sqrt(sum((g**2).sum() for g in grads)))


class Plan:
    """What the settings and the data fix before training: `updates_per_epoch`, `total` updates, the
    learning-rate `schedule`, the label-smoothed `loss`, the validation batches and the probe batch of
    the gradient norm. `data_settings`, `training` and `optimization` are the spec's parts; `data` the
    encoded splits."""

    def __init__(self, data_settings, training, optimization, data, batching):
        self.batching = batching  # packed or grid (`constants.BATCHINGS`)

        def batches(examples, **kw):
            return nmt_data.batch_examples(examples, data_settings.max_tokens, batching, **kw)

        self.valid_batches = batches(data["valid"], validation=True)  # few shapes to compile
        self.probe_batch = batches(data["train"][:256], seed=0)[0]
        self.updates_per_epoch = len(batches(data["train"], seed=0))
        total = training.epochs * self.updates_per_epoch
        self.total = min(total, training.max_updates) if training.max_updates else total
        self.schedule = translation_schedule(optimization, self.updates_per_epoch, self.total)
        # the update of the schedule's step, before which the run does not stop at a plateau (0: no step)
        self.step_at = optimization.decay_epoch * self.updates_per_epoch \
            if optimization.schedule in ("step", "decay_then_inverse_sqrt") else 0
        self.loss = LabelSmoothedCrossEntropy(training.label_smoothing, pad_id=nmt_data.PAD)


def translation_schedule(optimization, updates_per_epoch, total):
    """The learning-rate schedule of the spec's optimization part (its `schedule`, decided when the spec
    was built; `schedules.make_schedule`)."""
    check_warmup(optimization.warmup, total)
    return make_schedule(optimization.schedule, optimization.lr, optimization.warmup, total,
                         optimization.decay_epoch * updates_per_epoch, optimization.decay_factor)


def start_model(resume, settings, optimization, run_dir, setup, plan, vocab):
    """(model, `rundir.ResumePoint`): with `resume`, the run directory's newest checkpoint and where it
    stands; else a new model of the model part `settings`, compiled with the optimization part's optimizer,
    starting at update 0 of epoch 1."""
    if resume:
        start = resume_point(run_dir, TranslationTransformer, plan.updates_per_epoch)
        return start.model, start
    model = build_model(settings, vocab)
    model.compile(optimizer=make_optimizer(optimization, plan.schedule), loss=plan.loss,
                  jit_compile=devices.compile_xla(setup))
    return model, ResumePoint(model, None, 0)


def record_config(settings, run_dir, setup, plan, corpus, vocab):
    """A new run's config.json: `settings` (every field of the spec, `specs.TranslationSpec.config`), with
    what the data and the plan decided."""
    out = run_dir.path
    run_dir.write_config(settings, dict(
        data=corpus.description, vocab_size=vocab.target.size, updates_per_epoch=plan.updates_per_epoch,
        total_updates=plan.total, schedule=keras.saving.serialize_keras_object(plan.schedule), run_dir=out,
        vocab_file=os.path.relpath(vocab.target.path, out), bpe_split=corpus.bpe_split, batching=plan.batching,
        **({} if vocab.joint else dict(source_vocab_file=os.path.relpath(vocab.source.path, out)))), setup)


class Metrics:
    """The rows of metrics.csv: `validate` (the `Validation` callback's row: validation loss, greedy
    validation BLEU and the probe's gradient norm) and `diverged` (the `Divergence` callback's row)."""

    def __init__(self, data, decoding, run, run_dir, plan, setup, corpus, vocab, valid, greedy_step):
        self.data, self.decoding, self.run, self.run_dir, self.plan = data, decoding, run, run_dir, plan
        self.setup, self.vocab, self.corpus, self.greedy_step = setup, vocab, corpus, greedy_step
        self.valid = valid[: data.valid_sentences or None]
        self.references = references(corpus.splits["valid"], corpus)

    def lr(self, updates):
        """The rate of the update that brought the count to `updates` (the schedule counts from 0)."""
        return lr_at(self.plan.schedule, max(updates - 1, 0))

    def validate(self, model, train_loss, tokens_per_s):
        data, decoding, run, started = self.data, self.decoding, self.run, time.time()
        row = dict(epoch=run.epoch, updates=run.updates, lr=self.lr(run.updates),
                   train_loss=train_loss, tokens_per_s=tokens_per_s,
                   valid_loss=evaluate_loss(model, self.plan.valid_batches, self.setup))
        hyps = [self.vocab.target.decode(ids) for ids in translate(
            model, self.valid, 1, decoding.lenpen, data.max_tokens, self.greedy_step, **length_rules(decoding))]
        row["valid_bleu"] = bleu_scores(hyps, self.references[: len(hyps)], self.corpus, data.tgt)["bleu"]
        row["grad_norm"] = gradient_norm(model, self.plan.loss, self.plan.probe_batch)
        row["outcome"] = "ok"
        run.rows.append(row)
        self.run_dir.write_rows(run.rows)
        print(f"epoch {row['epoch']}, update {row['updates']}: lr {row['lr']:.2e}, train loss {row['train_loss']:.3f}, "
              f"valid loss {row['valid_loss']:.3f}, valid BLEU (greedy) {row['valid_bleu']:.2f}, "
              f"{row['tokens_per_s']:.0f} tok/s, grad norm {row['grad_norm']:.3f}, validation {time.time() - started:.0f}s, "
              f"{time.time() - run.started:.0f}s since start", flush=True)

    def diverged(self, value):
        run = self.run
        run.rows.append(dict(epoch=run.epoch, updates=run.updates, lr=self.lr(run.updates), train_loss=value,
                             tokens_per_s=float("nan"), valid_loss=float("nan"), valid_bleu=0.0,
                             grad_norm=float("nan"), outcome="diverged"))
        self.run_dir.write_rows(run.rows)
        print(f"epoch {run.epoch}: the loss became {value} at update {run.updates}: the run diverged "
              "(a result for this paper, not a crash); recorded in metrics.csv and results.json")


def make_callbacks(training, run, run_dir, plan, metrics, dataset):
    """fit's callbacks, in the order they act after each update (harness/callbacks.py); `training`: the
    spec's training part."""
    progress = Progress(plan.total, start=run.updates, every=training.log_every)
    callbacks = [
        Counter(run, dataset),
        Divergence(run, metrics.diverged),
        ProgressLog(run, progress, lambda step: lr_at(plan.schedule, step), dataset),
        # Every --eval-every updates since the last validation, and at the end of each epoch.
        Validation(run, metrics.validate, lambda now, last: training.eval_every and now - last >= training.eval_every,
                   progress),
        EpochCheckpoint(run, run_dir),
    ]
    if training.patience:  # the converged protocol: stop at the plateau of the validation loss
        callbacks.insert(4, Plateau(run, training.patience, training.min_delta, after=plan.step_at))
    if training.backup_every:  # within an epoch only: at its end the epoch checkpoint is written instead
        callbacks.append(StepBackup(
            run, due=lambda run: run.updates % training.backup_every == 0 and run.batch < plan.updates_per_epoch
            and not (run.stop and run.updates >= run.stop),
            save=lambda model, run, loss_state: run_dir.save_backup(model, run.epoch, run.batch, run.updates,
                                                                    loss_state)))
    return callbacks


def fit_epochs(model, dataset, run, callbacks, epochs, start):
    """Train from `start` (a `rundir.ResumePoint`) to the end of epoch `epochs`. fit runs len(dataset)
    updates an epoch, so the rest of an interrupted epoch is a fit of its own."""
    first = start.epoch
    if start.skip:
        fit(model, dataset, run, callbacks, epochs=first, initial_epoch=first - 1)
        dataset.skip, first = 0, first + 1
    if run.outcome != "diverged":
        fit(model, dataset, run, callbacks, epochs=epochs, initial_epoch=first - 1)


def summary(model, optimization, training, name, run, run_dir, corpus):
    """results.json's training part: the outcome, the updates, the best and final validation scores, and
    the settings that name the run (of the spec's `model`, `optimization` and `training` parts)."""
    rows = run.rows
    valid = [r for r in rows if is_finite(r["valid_loss"])]
    return dict(run=name, out=run_dir.path, outcome=run.outcome, epochs=int(rows[-1]["epoch"]) if rows else 0,
                updates=run.updates, data=corpus.description, norm=model.norm,
                layers=[model.encoder_layers, model.decoder_layers], lr=optimization.lr,
                warmup=not optimization.no_warmup,
                schedule=optimization.schedule, optimizer=optimization.optimizer,
                best_valid_loss=min((float(r["valid_loss"]) for r in valid), default=None),
                final_valid_loss=float(valid[-1]["valid_loss"]) if valid else None,
                best_valid_bleu=max((float(r["valid_bleu"]) for r in valid), default=None),
                train_minutes=round((time.time() - run.started) / 60, 2),
                **({"plateau_at": run.plateau_at} if training.patience else {}))


def compile_report(seconds, wall, programs=None):
    """results.json's compile_s, compile_share and compile_programs (XLA programs compiled or loaded from
    the compilation cache), printed as one line (jax); nothing on tensorflow and torch."""
    if seconds is None:
        return {}
    print(f"compiling: {seconds:.0f}s of {wall:.0f}s ({100 * seconds / wall:.0f} %), {programs} compilations: each "
          "batch shape's train step, the validation steps, decoding and single operations", flush=True)
    return dict(compile_s=round(seconds, 1), compile_share=round(seconds / wall, 3), compile_programs=programs)


# --- test ---------------------------------------------------------------------------------------

def test(model, corpus, vocab, examples, data, decoding, step_fn=None):
    """Test BLEU of `examples` (the first --test-sentences of them, if given, of the data part `data`), with
    the decoding part's beam search (`decoding`)."""
    examples = examples[: data.test_sentences or None]
    print(f"test: decoding {len(examples)} sentences, beam {decoding.beam}", flush=True)
    started = time.time()
    hyps = [vocab.target.decode(ids) for ids in translate(model, examples, decoding.beam, decoding.lenpen,
                                                          data.max_tokens, step_fn, decoding.unkpen,
                                                          **length_rules(decoding))]
    scores = bleu_scores(hyps, references(corpus.splits["test"], corpus)[: len(hyps)], corpus, data.tgt)
    scores.update(test_sentences=len(hyps), beam=decoding.beam, lenpen=decoding.lenpen, unkpen=decoding.unkpen,
                  **length_rules(decoding), sentences_per_s=round(len(hyps) / (time.time() - started), 2),
                  example=hyps[:3])
    print(f"test BLEU {scores['bleu']:.2f} ({scores['signature']}); tokenized BLEU {scores['tokenized_bleu']:.2f}; "
          f"beam {decoding.beam}, lenpen {decoding.lenpen}, {decoding_summary(decoding)}, {len(hyps)} sentences, "
          f"{time.time() - started:.0f}s")
    return {f"test_{k}" if not k.startswith("test") else k: v for k, v in scores.items()}
