"""The translation job's Keras side: what train_nmt.py's `train` calls, each function named for what it does,
and decoding (beam search, BLEU; its own section, below).

    corpus, vocab, data = load_data(spec.data, vocab_dir)                 # corpus, dictionaries, encoded splits
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
import sacrebleu
from keras import ops
from sacremoses import MosesDetokenizer, MosesTokenizer

from harness import devices, nmt_data
from harness.callbacks import (Counter, Divergence, EpochCheckpoint, Plateau, ProgressLog, ResumePoint, StepBackup,
                               Validation, fit, resume_point)
from harness.console import DecodingProgress, Progress, UsageError, check_warmup
from harness.devices import compiled, loss_and_gradients, lr_at
from harness.files import is_finite
from harness.specs import (BPE_MARKER, DECODING_BUCKETS, EOS, MAX_LEN, PAD, QKV_INITS, UNK, decoding_summary,
                           length_rules)
from models import LabelSmoothedCrossEntropy, TranslationTransformer
from optimizers import make_optimizer
from schedules import make_schedule


# --- data -----------------------------------------------------------------------------------------

def load_data(data, vocab_dir, dictionaries=None):
    """Corpus, `nmt_data.Dictionaries` (`dictionaries`, default the data part's: joint or separate) and
    encoded splits of the spec's data part `data`; prints what was loaded."""
    corpus = nmt_data.load_corpus(data.data_dir, data.src, data.tgt, corpus=data.corpus)
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
        self.batching = batching  # packed or grid (`specs.BATCHINGS`)

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


# --- decoding: beam search with the decoder cache, and BLEU ------------------------------------
# validation and test BLEU here, and harness/translate.py (--translate: raw text) and --benchmark:
#
#     step = beam_step(model, beam)                      # compiled once per model and beam size
#     ids = beam_search(model, source_ids, beam, step_fn=step)
#     hyps = translate(model, examples, beam, lenpen, max_tokens)   # any number of sentences, in order; progress
#                                                                   # on standard output (`DecodingProgress`)
#     bleu_scores(hyps, references(pairs, corpus), corpus, "en")    # detokenized sacrebleu and tokenized BLEU
#
# The decoding flags' defaults are `specs.DECODING` and their checks `specs.check_decoding`. Beam search
# follows fairseq's `sequence_generator.py`: hypotheses end with EOS, scores are sum(log p) / length^lenpen,
# and the defaults are fairseq-generate's: at most max_len_a * S + max_len_b = 200 tokens before EOS
# (--max-len-a 0 --max-len-b 200), at least min_len = 1 (--min-len 1: EOS is not the first token), <unk>
# allowed with no penalty (--unkpen 0).


def beam_step(model, beam, unkpen=0.0):
    """The compiled per-token work of `beam_search` for `beam`: reorder the caches to the surviving
    hypotheses, run one cached decoder step, and keep the best 2 x beam continuations of each
    sentence. Only those (and log p(EOS)) go back to the host, not the beam x vocabulary scores.
    PAD is never generated; <unk> costs `unkpen` (fairseq's --unkpen: log p(<unk>) - unkpen; 0 by
    default, inf bans it).

        step(last (B*K, 1), index, source_mask, cache, cross, scores (B*K,), origin (B*K,))
          -> (top scores (B, 2K), top flat indices k * vocab + token (B, 2K), log p(EOS) (B*K,), cache)
    """
    penalty = np.zeros(model.vocab_size, "float32")
    penalty[PAD], penalty[UNK] = np.inf, unkpen

    def step(last, index, source_mask, cache, cross, scores, origin):
        cache = [ops.take(layer, origin, axis=1) for layer in cache]  # (2, B*K, H, L, dk) each
        logits, cache = model.decode_step(last, index, source_mask, cache, cross)
        logp = ops.log_softmax(ops.cast(logits, "float32"), axis=-1) - penalty
        candidates = ops.reshape(ops.expand_dims(scores, 1) + logp, (-1, beam * model.vocab_size))
        top_scores, top_index = ops.top_k(candidates, 2 * beam)
        return top_scores, top_index, logp[:, EOS], cache

    return BeamStep(compiled(model, step), compiled(model, _encode_for_decoding(model)))


class BeamStep:
    """`beam_step`'s compiled functions: called, the per-token step; `encode`, the encoder pass and the
    cross-attention keys and values of a batch, compiled too, so that each batch shape is one program
    instead of one program per operation of the encoder for each shape."""

    def __init__(self, step, encode):
        self.step, self.encode = step, encode

    def __call__(self, *args):
        return self.step(*args)


def _encode_for_decoding(model):
    def encode(rows):  # (B*K, S) -> (source mask (B*K, 1, S), cross-attention cache)
        encoder_output, source_mask = model.encode(rows, training=False)
        return source_mask, model.cross_attention_cache(encoder_output)

    return encode


def beam_search(model, source_ids, beam=5, lenpen=1.2, max_len_a=0.0, max_len_b=200, min_len=1, step_fn=None):
    """Beam search with the decoder cache (fairseq style), greedy when beam = 1.

    A hypothesis ending in EOS is finished only when it is among the best `beam` candidates of its
    step, with score  sum(log p) / length^lenpen  (length counts the EOS). Returns token-id lists
    (without the EOS). Lengths as fairseq-generate's: a sentence of S source tokens (with its EOS) gets
    at most  max_len = min(max_len_a * S + max_len_b, MAX_LEN)  tokens before the EOS, which is forced
    then, and at least `min_len` (EOS is not a candidate before). fairseq takes S of the padded batch;
    here each sentence has its own, so that its translation does not depend on what it is batched with.
    `step_fn`: `beam_step(model, beam, unkpen)`, made once and passed in to compile only once.
    """
    step_fn = step_fn or beam_step(model, beam)
    source_ids = np.asarray(source_ids)
    batch, source_length = source_ids.shape
    # The cache from the padded length, so that every batch of a bucket has one shape (one compilation);
    # each sentence ends by its own limit, whatever it is batched with.
    max_len = int(min(MAX_LEN, max_len_a * source_length + max_len_b))
    limits = np.minimum(max_len, (max_len_a * (source_ids != PAD).sum(axis=1) + max_len_b).astype(int))
    if min_len > limits.min():
        raise ValueError(f"min_len {min_len} is above the length limit {limits.min()} of a sentence")
    rows = np.repeat(source_ids, beam, axis=0)  # (B * K, S)
    source_mask, cross = step_fn.encode(rows.astype("int32"))
    cache = model.init_cache(batch * beam, max_len + 1)  # decoder inputs: EOS and up to max_len tokens
    scores = np.full((batch, beam), -np.inf)
    scores[:, 0] = 0.0
    tokens = np.full((batch, beam, 0), PAD, "int64")
    finished = [[] for _ in range(batch)]  # (score, tokens)
    last = np.full((batch * beam, 1), EOS, "int32")
    origin = np.arange(batch * beam)  # the hypothesis each row continues
    for step in range(max_len + 1):
        # numpy arrays go to the compiled step as they are: on jax, converting one to a tensor outside a
        # compiled function compiles a program of its own for each shape.
        top_scores, top, eos_logp, cache = step_fn(
            last, np.int32(step), source_mask, cache, cross, scores.reshape(-1).astype("float32"),
            origin.astype("int32"))
        top_scores = np.asarray(ops.convert_to_numpy(top_scores), "float64")  # (B, 2K), best first
        top = np.asarray(ops.convert_to_numpy(top), "int64")
        forced = np.flatnonzero(limits == step)
        if forced.size:  # a sentence at its limit: EOS is the only continuation
            _force_eos(top_scores, top, scores, eos_logp, forced, model.vocab_size)
        new_scores, parent, new_last = _next_beam(top_scores, top, tokens, finished, step, lenpen, min_len,
                                                  model.vocab_size)
        if all(len(f) >= beam or not np.isfinite(new_scores[b]).any() for b, f in enumerate(finished)):
            break
        origin = (np.arange(batch)[:, None] * beam + parent).reshape(-1)
        tokens = np.concatenate([tokens[np.arange(batch)[:, None], parent], new_last[:, :, None]], axis=2)
        scores = new_scores
        last = new_last.reshape(-1, 1).astype("int32")
    return [max(f)[1] if f else [] for f in finished]


def _force_eos(top_scores, top, scores, eos_logp, forced, vocab_size):
    """Make EOS the only continuation of the sentences `forced` (at their length limit), in place: their
    candidates `top_scores` and `top` (B, 2K) become each hypothesis's score (`scores`, B x K) plus its log
    p(EOS) (`eos_logp`, B*K), best first, and -inf after the K of them."""
    batch, beam = scores.shape
    ends = (scores + np.asarray(ops.convert_to_numpy(eos_logp), "float64").reshape(batch, beam))[forced]
    order = np.argsort(-ends, axis=1, kind="stable")
    top_scores[forced], top[forced] = -np.inf, 0
    top_scores[forced, :beam] = np.take_along_axis(ends, order, 1)
    top[forced, :beam] = order * vocab_size + EOS


def _next_beam(top_scores, top, tokens, finished, step, lenpen, min_len, vocab_size):
    """(scores, hypothesis continued, token), each (B, K), of the next step's live hypotheses: the best K
    candidates of each sentence (`top_scores` and `top`, k * vocab + token, best first) that do not end in
    EOS. A candidate ending in EOS among the best K, from step `min_len` on, goes into the sentence's
    `finished` list instead (score / (step + 1)^lenpen, and the tokens of `tokens` (B, K, step) it ends); a
    sentence with K finished hypotheses keeps none live (scores -inf)."""
    batch, beam, _ = tokens.shape
    new_scores = np.full((batch, beam), -np.inf)
    parent = np.zeros((batch, beam), "int64")
    new_last = np.full((batch, beam), EOS, "int64")
    for b in range(batch):
        live = 0
        for rank, (score, flat) in enumerate(zip(top_scores[b], top[b])):
            if not np.isfinite(score) or len(finished[b]) >= beam:
                break
            k, token = divmod(int(flat), vocab_size)
            if token == EOS:
                if rank < beam and step >= min_len:  # EOS counts only among the top `beam` candidates
                    finished[b].append((score / (step + 1) ** lenpen, tokens[b, k].tolist()))
                continue
            if live < beam:
                new_scores[b, live], parent[b, live], new_last[b, live] = score, k, token
                live += 1
        if len(finished[b]) >= beam:
            new_scores[b] = -np.inf
    return new_scores, parent, new_last


def translate(model, examples, beam, lenpen, max_tokens, step_fn=None, unkpen=0.0, progress="decoding",
              progress_every=30.0, **lengths):
    """Decode the source side of encoded examples, in input order. `lengths`: max_len_a, max_len_b and
    min_len of `beam_search`; `unkpen` as `beam_step`'s (used only when no `step_fn` is given).
    `progress`: the label of `DecodingProgress`'s lines (a line every `progress_every` seconds and a
    final one), or None for none."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i][0]))
    results = [None] * len(examples)
    rows = max(1, min(128, max_tokens // (16 * beam)))
    step_fn = step_fn or beam_step(model, beam, unkpen)
    shown = DecodingProgress(len(examples), progress, progress_every) if progress and examples else None
    for start in range(0, len(order), rows):
        chunk = order[start:start + rows]
        length = next(b for b in DECODING_BUCKETS if b >= max(len(examples[i][0]) for i in chunk))
        source = np.full((rows, length), PAD, "int32")
        source[:, 0] = EOS  # filler rows
        for r, i in enumerate(chunk):
            source[r, :len(examples[i][0])] = examples[i][0]
        for i, ids in zip(chunk, beam_search(model, source, beam, lenpen, step_fn=step_fn, **lengths)):
            results[i] = ids
        if shown:
            shown.update(start + len(chunk))
    return results


def bleu_scores(hypotheses, references, corpus, tgt):
    """Detokenized sacrebleu BLEU (with signature) and tokenized, lowercased BLEU (the paper's)."""
    if corpus.bpe_split:  # already Moses-tokenized text: detokenize for sacrebleu
        detok = MosesDetokenizer(lang=tgt)
        tokenized_hyp, tokenized_ref = hypotheses, references
        hyp = [detok.detokenize(h.split()) for h in hypotheses]
        ref = [detok.detokenize(r.split()) for r in references]
    else:
        tok = MosesTokenizer(lang=tgt)
        hyp, ref = hypotheses, references
        tokenized_hyp = [tok.tokenize(h, return_str=True, escape=False) for h in hypotheses]
        tokenized_ref = [tok.tokenize(r, return_str=True, escape=False) for r in references]
    metric = sacrebleu.BLEU(force=True)  # our hypotheses are detokenized text; a final " ." is the model's
    detok_bleu = metric.corpus_score(hyp, [ref])
    tokenized = sacrebleu.BLEU(tokenize="none", lowercase=True, force=True).corpus_score(tokenized_hyp, [tokenized_ref])
    return dict(bleu=round(detok_bleu.score, 2), signature=str(metric.get_signature()),
                tokenized_bleu=round(tokenized.score, 2))


def references(pairs, corpus):
    return [(t + " ").replace(BPE_MARKER, "").strip() if corpus.bpe_split else t for _, t in pairs]
