"""BERT masked-LM pretraining's Keras side: what pretrain_bert.py's `pretrain` calls, each function named for
what it does.

    loaded = load_data(spec.data, spec.training, vocab_dir)   # WordPiece, packed sequences, masked validation
    model, start = start_model(spec.resume, spec.model, spec.data, spec.optimization, run_dir, setup, schedule,
                               loaded["vocab_size"])            # new and compiled, or the newest checkpoint's
    callbacks = make_callbacks(spec.training, run, run_dir, schedule, metrics, dataset, stop)

Each takes the parts of a `specs.BertSpec` it uses (`spec.model`, `spec.data`, `spec.optimization`,
`spec.training`), never the spec whole, and changes none. pretrain_bert.py imports this module once
run_script has checked KERAS_BACKEND. Fine-tuning on GLUE (--finetune) is harness/glue.py, a mode
pretraining does not import.
"""

import os
import shutil
import time

import keras
import numpy as np

from harness import bert_data, devices
from harness.callbacks import (Counter, Divergence, Plateau, ProgressLog, ResumePoint, StepBackup, Validation,
                               resume_point)
from harness.console import Progress, UsageError
from harness.devices import lr_at
from harness.files import is_finite
from models import BertMaskedLM, LabelSmoothedCrossEntropy
from optimizers import bert_optimizer as make_optimizer  # BERT's AdamW
from optimizers import exclude_from_decay


# --- data -----------------------------------------------------------------------------------------

def load_data(data, training, vocab_dir, vocab_file=None):
    """Corpus -> 199:1 document split -> WordPiece -> packed sequences; the validation set masked once, as the
    spec's data part `data` says, split and packed by the training part's seed, batched by its batch size.

    The tokenizer is `vocab_file` (copied into `vocab_dir`) if given, else learned (or found) there.
    Returns a dict: tokenizer and its path, vocab_size, train (token ids, segment ids, NSP labels),
    valid (a list of (inputs, targets) batches with a fixed masking), description.
    """
    documents, description = bert_data.load_corpus(data.corpus)
    train_docs, valid_docs = bert_data.split_documents(documents, training.seed)
    distinct = len({w.lower() for d in train_docs for s in d for w in s.split()})
    vocab_size = min(data.vocab_size, max(256, distinct // 4))  # a small corpus gets a smaller vocabulary
    if vocab_file:
        tokenizer, vocab_size = bert_data.load_tokenizer(vocab_file), data.vocab_size
        path = os.path.join(vocab_dir, os.path.basename(vocab_file))
        os.makedirs(vocab_dir, exist_ok=True)
        if not os.path.exists(path):
            shutil.copyfile(vocab_file, path)  # the run directory holds what fine-tuning needs
    else:
        tokenizer, path = bert_data.build_tokenizer(train_docs, vocab_size, vocab_dir)
    train, valid = (bert_data.pack_sequences(bert_data.encode_documents(docs, tokenizer), data.seq_len, data.nsp, seed)
                    for docs, seed in ((train_docs, training.seed), (valid_docs, 0)))
    valid = [x[: data.valid_sequences or None] for x in valid]
    if len(train[0]) < training.batch_size:
        raise UsageError(f"the training split packs into {len(train[0])} sequences, fewer than --batch-size "
                         f"{training.batch_size}; give a larger --corpus or a smaller --batch-size")
    vocab = tokenizer.get_vocab_size()
    # A fixed masking of the validation split (seed 0 whatever --seed is): every run sees the same task.
    rng, batches = np.random.default_rng(0), []
    for rows, real in bert_data.batch_rows(len(valid[0]), training.batch_size):
        nsp_labels = valid[2][rows] if data.nsp else None
        batches.append((bert_data.masked_batch(valid[0][rows], valid[1][rows], nsp_labels, rng, vocab,
                                               bert_data.max_predictions(data.seq_len)), real))
    print(f"data: {description}: {len(train_docs)} training documents, {len(train[0])} sequences of {data.seq_len} "
          f"tokens; {len(valid_docs)} validation documents, {len(valid[0])} sequences; WordPiece vocabulary {vocab}"
          + (f" (asked {data.vocab_size}, capped for this corpus)" if vocab_size < data.vocab_size else ""))
    return dict(tokenizer_path=path, vocab_size=vocab, train=train, valid=batches, description=description,
                unigram_entropy=bert_data.unigram_entropy(train[0]))


def training_batch(data, training, train, vocab_size, step):
    """The batch of update `step + 1`, a function of (seed, step) only, so a resumed run sees the same data
    (`data` and `training`: the spec's data and training parts).

    Each epoch is a seeded permutation of the training sequences (the last partial batch is dropped);
    the masking is drawn anew for every batch (dynamic masking).
    """
    token_ids, segment_ids, nsp_labels = train
    per_epoch = len(token_ids) // training.batch_size
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([training.seed, 0, epoch]).permutation(len(token_ids))
    rows = order[index * training.batch_size:(index + 1) * training.batch_size]
    rng = np.random.default_rng([training.seed, 1, step])
    return bert_data.masked_batch(token_ids[rows], segment_ids[rows], nsp_labels[rows] if data.nsp else None, rng,
                                  vocab_size, bert_data.max_predictions(data.seq_len))


# --- model, losses, evaluation --------------------------------------------------------------------

def build_model(settings, data, vocab_size):
    """The BertMaskedLM of the spec's model part `settings`, with the positions and NSP head its data part
    `data` asks for."""
    # At least 128 positions, so that GLUE fine-tuning at 128 tokens fits a model pretrained on shorter sequences.
    model = BertMaskedLM(vocab_size, num_layers=settings.layers, d_model=settings.d_model, num_heads=settings.heads,
                         ffn_dim=settings.ffn_dim, max_positions=max(data.seq_len, 128), norm=settings.norm,
                         deepnorm_rule=settings.deepnorm_rule, dropout=settings.dropout,
                         attention_dropout=settings.attention_dropout, next_sentence=data.nsp, pad_id=bert_data.PAD,
                         layer_norm_epsilon=settings.layer_norm_epsilon, activation=settings.activation,
                         initializer=settings.initializer)
    model.build()
    return model


def pretraining_losses(nsp):
    """Masked-LM cross entropy over the used prediction slots (label [PAD] marks an unused one), plus NSP with
    `nsp`."""
    losses = {"mlm_logits": LabelSmoothedCrossEntropy(0.0, pad_id=bert_data.PAD)}
    if nsp:
        losses["nsp_logits"] = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return losses


def evaluate(model, batches, setup=None):
    """Validation masked-LM loss (mean over predicted tokens) and accuracy; NSP accuracy with NSP."""
    nll = correct = count = nsp_correct = nsp_count = 0.0
    for (inputs, targets), real in batches:
        outputs = model.predict_on_batch(setup.pad(inputs) if setup else inputs)
        logits = np.asarray(outputs["mlm_logits"], "float64")[:real]
        labels = targets["mlm_logits"][:real]
        used = labels != bert_data.PAD
        top = logits.max(-1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]  # log-sum-exp
        nll += float(((log_z - np.take_along_axis(logits, labels[..., None], -1)[..., 0]) * used).sum())
        correct += float(((logits.argmax(-1) == labels) & used).sum())
        count += float(used.sum())
        if "nsp_logits" in targets:
            nsp_predicted = np.asarray(outputs["nsp_logits"])[:real].argmax(-1)
            nsp_correct += float((nsp_predicted == targets["nsp_logits"][:real]).sum())
            nsp_count += real
    scores = dict(valid_loss=nll / max(count, 1), valid_accuracy=correct / max(count, 1))
    if nsp_count:
        scores["valid_nsp_accuracy"] = nsp_correct / nsp_count
    return scores


# --- pretraining ----------------------------------------------------------------------------------

def make_callbacks(training, run, run_dir, schedule, metrics, dataset, stop):
    """fit's callbacks, in the order they act after each update (harness/callbacks.py), for `stop` updates;
    `training`: the spec's training part."""
    progress = Progress(stop, start=run.updates, every=training.log_every)
    return [
        Counter(run, dataset),
        Divergence(run, metrics.diverged),
        ProgressLog(run, progress, lambda step: lr_at(schedule, step), dataset),
        Validation(run, metrics.validate, lambda now, last: now % training.eval_every == 0 or now == stop, progress),
        *([Plateau(run, training.patience, training.min_delta)] if training.patience else []),
        StepBackup(run, due=lambda run: run.updates % training.save_every == 0 or run.updates in (stop, run.plateau_at),
                   save=lambda model, run, loss_state: run_dir.save_step(
                       model, run.updates, loss_state, round(time.time() - run.started, 1))),
    ]


def start_model(resume, architecture, data, optimization, run_dir, setup, schedule, vocab_size):
    """(model, `rundir.ResumePoint`): with `resume`, the newest step checkpoint that loads (a corrupt one
    is skipped with a warning; rows after it are redone); else a new model of the spec's model part
    `architecture` (the positions and NSP head of its data part `data`), compiled with its optimization
    part's AdamW."""
    if resume:
        start = resume_point(run_dir, BertMaskedLM)
        exclude_from_decay(start.model.optimizer)
        return start.model, start
    model = build_model(architecture, data, vocab_size)
    model.compile(optimizer=make_optimizer(optimization, schedule), loss=pretraining_losses(data.nsp),
                  jit_compile=devices.compile_xla(setup))
    return model, ResumePoint(model, None, 0)


class Metrics:
    """The rows of metrics.csv: `validate` (masked-LM loss and accuracy on the fixed validation masking)
    and `diverged`."""

    def __init__(self, run, run_dir, schedule, valid, setup):
        self.run, self.run_dir, self.schedule, self.valid, self.setup = run, run_dir, schedule, valid, setup

    def validate(self, model, train_loss, tokens_per_s):
        run = self.run
        row = dict(updates=run.updates, lr=lr_at(self.schedule, run.updates - 1), train_loss=train_loss,
                   **evaluate(model, self.valid, self.setup), elapsed_s=round(time.time() - run.started, 1),
                   outcome="ok")
        run.rows.append(row)
        self.run_dir.write_rows(run.rows)
        print(f"update {row['updates']}: lr {row['lr']:.2e}, train loss {row['train_loss']:.3f}, valid loss "
              f"{row['valid_loss']:.3f}, valid accuracy {row['valid_accuracy']:.3f}, {row['elapsed_s']:.0f}s", flush=True)

    def diverged(self, value):
        run = self.run
        run.rows.append(dict(updates=run.updates, lr=lr_at(self.schedule, run.updates - 1), train_loss=value,
                             valid_loss=float("nan"), valid_accuracy=float("nan"), outcome="diverged"))
        self.run_dir.write_rows(run.rows)
        print(f"\nupdate {run.updates}: the loss became {value}: the run diverged (a result for this paper, not a "
              "crash); recorded in metrics.csv and results.json")


def summary(norm, optimization, name, run, run_dir, data):
    """results.json: the outcome, the updates, the final and best validation scores, the time; the run's
    placement `norm` and its peak lr and warmup (`optimization`, the spec's optimization part)."""
    valid = [r for r in run.rows if is_finite(r["valid_loss"])]
    return dict(run=name, out=run_dir.path, outcome=run.outcome, updates=run.updates, norm=norm, lr=optimization.lr,
                warmup_steps=optimization.warmup, data=data["description"],
                final_valid_loss=float(valid[-1]["valid_loss"]) if valid else None,
                final_valid_accuracy=float(valid[-1]["valid_accuracy"]) if valid else None,
                best_valid_loss=min((float(r["valid_loss"]) for r in valid), default=None),
                unigram_entropy=round(data["unigram_entropy"], 4), elapsed_s=round(time.time() - run.started, 1))
