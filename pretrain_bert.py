"""BERT masked-LM pretraining: Post-LN with warmup against Pre-LN without warmup (Figure 5), and GLUE fine-tuning.

    KERAS_BACKEND=torch python pretrain_bert.py --sweep fig5                  # Figure 5(a) at CPU scale
    KERAS_BACKEND=torch python pretrain_bert.py --recipe pre-no-warmup        # one run, default corpus
    python pretrain_bert.py --preset base --corpus wiki/ books/ --recipe post-warmup   # the paper (GPUs)
    python pretrain_bert.py --finetune mrpc --glue-dir glue/ --init runs/fig5/post-warmup runs/fig5/pre-no-warmup

Xiong et al. 2020, Section 4: Post-LN BERT needs 10k warmup updates to lr 1e-4 (at 3e-4 it diverges);
Pre-LN trains from lr 3e-4 with no warmup, both with linear decay, and reaches Post-LN's validation
loss 40 % sooner (Figure 5(a)); fine-tuned on MRPC and RTE its checkpoints are ahead too (Figure 5(b, c)).
A run writes runs/NAME/{config.json, metrics.csv, checkpoints/stepN.keras, state.json, results.json,
curves.png, vocab/}; a sweep one directory per recipe and an overlay plot; fine-tuning results.csv.
"""

import argparse
import json
import math
import os
import shutil
import sys
import time
import zipfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import bert_data  # noqa: E402
import distribution  # noqa: E402
from nmt_data import DataError  # noqa: E402
from train_nmt import OPTIMIZERS, _strip, lr_at  # noqa: E402
from training import (  # noqa: E402
    OneLineParser,
    UsageError,
    Progress,
    is_finite,
    load_checkpoint,
    load_latest_checkpoint,
    open_run_dir,
    plot_panels,
    prepare_out_dir,
    read_csv,
    run_config,
    run_script,
    write_csv,
    write_json,
)

# Devlin et al. 2019's BERT recipe, which the paper follows (Section 4, Appendix A): every preset has it.
DEVLIN = dict(
    # google-research/bert optimization.py create_optimizer: AdamWeightDecayOptimizer(weight_decay_rate=0.01,
    # beta_1=0.9, beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]).
    adam_betas=(0.9, 0.999),
    adam_epsilon=1e-6,
    weight_decay=0.01,  # decoupled (lr * 0.01 * w), and not on LayerNorm gamma / beta or biases: NO_DECAY
    clip_norm=1.0,  # optimization.py: tf.clip_by_global_norm(grads, clip_norm=1.0)
    layer_norm_epsilon=1e-12,  # modeling.py layer_norm: tf.contrib.layers.layer_norm, variance epsilon 1e-12
    activation="gelu_tanh",  # modeling.py gelu: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    initializer="bert",  # modeling.py create_initializer: truncated normal, std initializer_range = 0.02
)
# Devlin's exclude_from_weight_decay, by Keras's variable names: LayerNorm's gamma and beta, every bias
# (the dense layers' and the masked-LM output's mlm_bias). Embeddings and kernels are decayed.
NO_DECAY = ("gamma", "beta", "bias")
PRESETS = {
    # BERT-base (Devlin et al.; the paper's Appendix A): 12 layers, 768, 12 heads, FFN 3072, batches of
    # 256 sequences of 128 tokens, 1M updates, 10k warmup. For GPUs and a real corpus (--corpus).
    "base": dict(DEVLIN, layers=12, d_model=768, heads=12, ffn_dim=3072, dropout=0.1, attention_dropout=0.1,
                 vocab_size=30522, seq_len=128, batch_size=256, steps=1_000_000, warmup_steps=10_000,
                 eval_every=10_000, save_every=100_000, valid_sequences=4096),
    # Minutes on 2 CPU cores on the default corpus (about 5,300 training sequences of 128 tokens, so
    # 300 updates are under 2 epochs). The warmup keeps its role, a short start of the run, at 10 %.
    "cpu": dict(DEVLIN, layers=4, d_model=128, heads=4, ffn_dim=512, dropout=0.1, attention_dropout=0.1,
                vocab_size=8000, seq_len=128, batch_size=32, steps=300, warmup_steps=30,
                eval_every=25, save_every=100, valid_sequences=0),
    # For tests.
    "tiny": dict(DEVLIN, layers=2, d_model=32, heads=2, ffn_dim=64, dropout=0.0, attention_dropout=0.0,
                 vocab_size=300, seq_len=32, batch_size=8, steps=4, warmup_steps=2,
                 eval_every=2, save_every=2, valid_sequences=16),
}
RECIPES = {
    # Section 4: "Post-LN: 10k warmup steps to lr_max 1e-4, then linear decay".
    "post-warmup": dict(norm="post", lr=1e-4, no_warmup=False),
    # Section 4: "Pre-LN: linear decay from 3e-4 without warmup".
    "pre-no-warmup": dict(norm="pre", lr=3e-4, no_warmup=True),
}
SWEEPS = {"fig5": [("post-warmup", ["--recipe", "post-warmup"]),
                   ("pre-no-warmup", ["--recipe", "pre-no-warmup", "--no-warmup"])]}
# GLUE fine-tuning (Appendix A: batch 16 or 32, lr 1e-5 to 1e-4, 3 to 8 epochs, 6 seeds); explicit flags win.
FINETUNE = dict(lr=5e-5, batch_size=32, epochs=3)
FINETUNE_WARMUP = 0.1  # BERT's run_classifier: linear warmup over the first 10 % of the updates


# --- command line ---------------------------------------------------------------------------------

def parse_args(argv=None):
    p = OneLineParser(prog="pretrain_bert.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="cpu", help="cpu (default: minutes on 2 cores) | base (BERT-base) | tiny")
    p.add_argument("--recipe", default="post-warmup", help="post-warmup (Post-LN, warmup to 1e-4) | pre-no-warmup "
                   "(Pre-LN, 3e-4, no warmup); both decay linearly; --norm, --lr, --warmup-steps, --no-warmup override")
    p.add_argument("--norm", help="post | pre | deepnorm (default: the recipe's)")
    p.add_argument("--deepnorm-rule", default="paper", choices=("paper", "torchscale", "sgd", "adam", "lamb"),
                   help="DeepNorm constants for an encoder-only stack (layers.deepnorm_constants); default paper")
    group = p.add_argument_group("data")
    group.add_argument("--corpus", nargs="+", metavar="PATH", help="text files or directories in BERT's format "
                       "(one sentence a line, a blank line between documents); default: gensim's Wikipedia sample")
    group.add_argument("--vocab-size", type=int, help="WordPiece vocabulary (base 30522)")
    group.add_argument("--vocab", metavar="FILE", help="use this tokenizer (RUN/vocab/wordpiece-*.json of another "
                       "run) instead of learning one: runs to compare share one vocabulary")
    group.add_argument("--seq-len", type=int, help="tokens per sequence (BERT 128)")
    group.add_argument("--nsp", action="store_true", help="next-sentence pairs and BERT's NSP head")
    group.add_argument("--valid-sequences", type=int, help="validation sequences evaluated (0 = all)")
    group = p.add_argument_group("model")
    for flag in ("--layers", "--d-model", "--heads", "--ffn-dim"):
        group.add_argument(flag, type=int)
    for flag in ("--dropout", "--attention-dropout"):
        group.add_argument(flag, type=float)
    group.add_argument("--activation", choices=("gelu_tanh", "gelu", "relu"),
                       help="FFN and masked-LM transform (default BERT's gelu_tanh, the tanh approximation)")
    group.add_argument("--initializer", choices=("bert", "xavier"),
                       help="kernels: bert (default: truncated normal, std 0.02) | xavier (the translation model's)")
    group.add_argument("--layer-norm-epsilon", type=float, help="LayerNorm eps (BERT 1e-12)")
    group = p.add_argument_group("training")
    group.add_argument("--steps", type=int, help="updates; the linear decay reaches 0 there (base 1M)")
    group.add_argument("--max-updates", type=int, default=0, help="stop after this many updates (the schedule "
                       "still spans --steps); continue with --resume")
    group.add_argument("--batch-size", type=int, help="sequences per update (base 256; fine-tuning 32)")
    group.add_argument("--lr", type=float, help="peak learning rate (default: the recipe's; fine-tuning 5e-5)")
    group.add_argument("--warmup-steps", type=int, help="linear warmup updates (paper 10000)")
    group.add_argument("--no-warmup", action="store_true", default=None, help="no warmup: decay from the first update")
    group.add_argument("--optimizer", default="adam",
                       help="adam (BERT's: AdamW with --adam-betas, --adam-epsilon, --weight-decay) | sgd | radam")
    group.add_argument("--adam-betas", type=float, nargs=2, metavar=("BETA1", "BETA2"), help="BERT 0.9 0.999")
    group.add_argument("--adam-epsilon", type=float, help="BERT 1e-6")
    group.add_argument("--weight-decay", type=float, help="decoupled weight decay (BERT 0.01), never on LayerNorm "
                       "gamma / beta and biases")
    group.add_argument("--clip-norm", type=float, help="clip the global gradient norm (BERT 1.0; 0 = off)")
    group.add_argument("--seed", type=int, default=1)
    group.add_argument("--eval-every", type=int, help="updates between validation losses")
    group.add_argument("--log-every", type=int, default=50, metavar="UPDATES",
                       help="when the output is not a terminal, a progress line every UPDATES updates (0 = none; "
                            "default 50)")
    group.add_argument("--save-every", type=int, help="updates between checkpoints")
    group = p.add_argument_group("runs")
    group.add_argument("--out", help="run directory (default runs/NAME)")
    group.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    group.add_argument("--sweep", help="fig5: both recipes, an overlay plot and the speed-up")
    group = p.add_argument_group("fine-tuning (Figure 5(b, c))")
    group.add_argument("--finetune", metavar="TASK", help="mrpc | rte: sentence-pair classification on GLUE")
    group.add_argument("--glue-dir", help="the task's train.tsv and dev.tsv (or a GLUE folder holding MRPC/, RTE/)")
    group.add_argument("--init", nargs="+", metavar="CHECKPOINT", help="pretraining checkpoints (.keras), or run "
                       "directories: all their checkpoints")
    group.add_argument("--seeds", type=int, default=6, help="fine-tuning runs per checkpoint (paper 6)")
    group.add_argument("--epochs", type=int, help="fine-tuning epochs (paper 3 to 8; default 3)")
    distribution.add_arguments(p)
    args = p.parse_args(argv)
    if args.preset not in PRESETS:
        raise UsageError(f"--preset {args.preset}: unknown; choose from {', '.join(PRESETS)}")
    if args.recipe not in RECIPES:
        raise UsageError(f"--recipe {args.recipe}: unknown; choose from {', '.join(RECIPES)}")
    recipe = RECIPES[args.recipe]
    defaults = {"norm": recipe["norm"], "lr": recipe["lr"], **(FINETUNE if args.finetune else {})}
    if args.no_warmup is None:  # an explicit --warmup-steps turns the warmup on, even in pre-no-warmup
        args.no_warmup = recipe["no_warmup"] and args.warmup_steps is None
    for key, value in {**PRESETS[args.preset], **defaults}.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args


def check_args(args):
    from layers import NORMS

    if args.norm not in NORMS:
        raise UsageError(f"--norm {args.norm}: unknown; choose from {', '.join(NORMS)}")
    if args.optimizer not in OPTIMIZERS:
        raise UsageError(f"--optimizer {args.optimizer}: unknown; choose from {', '.join(OPTIMIZERS)}")
    if args.sweep is not None and args.sweep not in SWEEPS:
        raise UsageError(f"--sweep {args.sweep}: unknown; choose from {', '.join(SWEEPS)}")
    for name in ("layers", "d_model", "heads", "ffn_dim", "vocab_size", "batch_size", "steps", "eval_every",
                 "save_every", "seeds", "epochs"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    for name in ("max_updates", "warmup_steps", "valid_sequences", "log_every"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not 8 <= args.seq_len <= 512:
        raise UsageError(f"--seq-len must be between 8 and 512 (BERT's positions), got {args.seq_len}")
    if not args.lr > 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if args.d_model % args.heads:
        raise UsageError(f"--d-model {args.d_model} must be divisible by --heads {args.heads}")
    for name in ("dropout", "attention_dropout"):
        if not 0 <= getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(args, name)}")
    if args.weight_decay < 0 or args.clip_norm < 0:
        raise UsageError("--weight-decay and --clip-norm must be >= 0")
    if not all(0 <= beta < 1 for beta in args.adam_betas):
        raise UsageError(f"--adam-betas must be in [0, 1), got {' '.join(map(str, args.adam_betas))}")
    if not args.adam_epsilon > 0 or not args.layer_norm_epsilon > 0:
        raise UsageError("--adam-epsilon and --layer-norm-epsilon must be positive")
    distribution.check_arguments(args)
    if args.finetune is not None:
        if args.finetune not in bert_data.GLUE_TASKS:
            raise UsageError(f"--finetune {args.finetune}: unknown; choose from {', '.join(bert_data.GLUE_TASKS)}")
        if not args.glue_dir or not args.init:
            raise UsageError("--finetune needs --glue-dir (the task's train.tsv and dev.tsv) and --init CHECKPOINT...")
    elif args.init or args.glue_dir:
        raise UsageError("--init and --glue-dir go with --finetune mrpc|rte")


# --- data -----------------------------------------------------------------------------------------

def load_data(args, vocab_dir, vocab_file=None):
    """Corpus -> 199:1 document split -> WordPiece -> packed sequences; the validation set masked once.

    The tokenizer is `vocab_file` (copied into `vocab_dir`) if given, else learned (or found) there.
    Returns a dict: tokenizer and its path, vocab_size, train (token ids, segment ids, NSP labels),
    valid (a list of (inputs, targets) batches with a fixed masking), description.
    """
    documents, description = bert_data.load_corpus(args.corpus)
    train_docs, valid_docs = bert_data.split_documents(documents, args.seed)
    distinct = len({w.lower() for d in train_docs for s in d for w in s.split()})
    vocab_size = min(args.vocab_size, max(256, distinct // 4))  # a small corpus gets a smaller vocabulary
    if vocab_file:
        tokenizer, vocab_size = bert_data.load_tokenizer(vocab_file), args.vocab_size
        path = os.path.join(vocab_dir, os.path.basename(vocab_file))
        os.makedirs(vocab_dir, exist_ok=True)
        if not os.path.exists(path):
            shutil.copyfile(vocab_file, path)  # the run directory holds what fine-tuning needs
    else:
        tokenizer, path = bert_data.build_tokenizer(train_docs, vocab_size, vocab_dir)
    train, valid = (bert_data.pack_sequences(bert_data.encode_documents(docs, tokenizer), args.seq_len, args.nsp, seed)
                    for docs, seed in ((train_docs, args.seed), (valid_docs, 0)))
    valid = [x[: args.valid_sequences or None] for x in valid]
    if len(train[0]) < args.batch_size:
        raise UsageError(f"the training split packs into {len(train[0])} sequences, fewer than --batch-size "
                         f"{args.batch_size}; give a larger --corpus or a smaller --batch-size")
    vocab = tokenizer.get_vocab_size()
    # A fixed masking of the validation split (seed 0 whatever --seed is): every run sees the same task.
    rng, batches = np.random.default_rng(0), []
    for rows, real in _batch_rows(len(valid[0]), args.batch_size):
        nsp_labels = valid[2][rows] if args.nsp else None
        batches.append((bert_data.masked_batch(valid[0][rows], valid[1][rows], nsp_labels, rng, vocab,
                                               bert_data.max_predictions(args.seq_len)), real))
    print(f"data: {description}: {len(train_docs)} training documents, {len(train[0])} sequences of {args.seq_len} "
          f"tokens; {len(valid_docs)} validation documents, {len(valid[0])} sequences; WordPiece vocabulary {vocab}"
          + (f" (asked {args.vocab_size}, capped for this corpus)" if vocab_size < args.vocab_size else ""))
    return dict(tokenizer_path=path, vocab_size=vocab, train=train, valid=batches, description=description)


def _batch_rows(count, batch_size):
    """(row indices, rows that count) of fixed-size batches covering `count` rows: one compiled shape.

    The last batch is filled up by wrapping around to the first rows, which are then not counted.
    """
    return [(np.arange(start, start + batch_size) % count, min(batch_size, count - start))
            for start in range(0, count, batch_size)]


def training_batch(args, train, vocab_size, step):
    """The batch of update `step + 1`, a function of (seed, step) only, so a resumed run sees the same data.

    Each epoch is a seeded permutation of the training sequences (the last partial batch is dropped);
    the masking is drawn anew for every batch (dynamic masking).
    """
    token_ids, segment_ids, nsp_labels = train
    per_epoch = len(token_ids) // args.batch_size
    epoch, index = divmod(step, per_epoch)
    order = np.random.default_rng([args.seed, 0, epoch]).permutation(len(token_ids))
    rows = order[index * args.batch_size:(index + 1) * args.batch_size]
    rng = np.random.default_rng([args.seed, 1, step])
    return bert_data.masked_batch(token_ids[rows], segment_ids[rows], nsp_labels[rows] if args.nsp else None, rng,
                                  vocab_size, bert_data.max_predictions(args.seq_len))


# --- model, schedule, evaluation ------------------------------------------------------------------

def build_model(args, vocab_size):
    from models import BertMaskedLM

    # At least 128 positions, so that GLUE fine-tuning at 128 tokens fits a model pretrained on shorter sequences.
    model = BertMaskedLM(vocab_size, num_layers=args.layers, d_model=args.d_model, num_heads=args.heads,
                         ffn_dim=args.ffn_dim, max_positions=max(args.seq_len, 128), norm=args.norm,
                         deepnorm_rule=args.deepnorm_rule, dropout=args.dropout,
                         attention_dropout=args.attention_dropout, next_sentence=args.nsp, pad_id=bert_data.PAD,
                         layer_norm_epsilon=args.layer_norm_epsilon, activation=args.activation,
                         initializer=args.initializer)
    model.build()
    return model


def make_optimizer(args, schedule):
    """BERT's optimizer (google-research/bert optimization.py, `DEVLIN`): Adam with decoupled weight decay,

        w <- w - lr_t (Adam step + weight_decay w),   Adam's betas --adam-betas, eps --adam-epsilon,

    the decay skipping LayerNorm's gamma and beta and all biases (`exclude_from_decay`), the gradients
    clipped to global norm --clip-norm. Keras's Adam keeps Adam's bias correction, which BERT's
    AdamWeightDecayOptimizer leaves out. --optimizer sgd | radam: the same decay, clipping (and betas).
    """
    import keras

    from optimizers import RAdam

    common = dict(learning_rate=schedule)
    if args.clip_norm:
        common["global_clipnorm"] = args.clip_norm
    if args.weight_decay:
        common["weight_decay"] = args.weight_decay
    adam = dict(beta_1=args.adam_betas[0], beta_2=args.adam_betas[1], epsilon=args.adam_epsilon)
    if args.optimizer == "adam":
        optimizer = (keras.optimizers.AdamW if args.weight_decay else keras.optimizers.Adam)(**adam, **common)
    elif args.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(**common)
    else:
        optimizer = RAdam(**adam, **common)
    return exclude_from_decay(optimizer)


def exclude_from_decay(optimizer):
    """No weight decay on the variables named in NO_DECAY (Devlin's exclude_from_weight_decay).

    Keras does not save this in a checkpoint's optimizer, so a loaded optimizer needs it again.
    """
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    return optimizer


def bert_schedule(lr, warmup_steps, total_steps):
    """BERT's schedules (Section 4), with t the update index:

        Post-LN:  lr(t) = lr_max t / T_warmup  for t < T_warmup, then lr_max (N - t) / (N - T_warmup)
        Pre-LN:   lr(t) = lr_max (N - t) / N    (no warmup),     N = total updates
    """
    from schedules import LinearDecay, LinearWarmup

    if warmup_steps >= total_steps:
        raise UsageError(f"--warmup-steps {warmup_steps} is not shorter than training ({total_steps} updates); "
                         "lower --warmup-steps or raise --steps")
    decay = LinearDecay(lr, total_steps, decay_start=warmup_steps)
    return LinearWarmup(warmup_steps, decay) if warmup_steps else decay


def pretraining_losses(args):
    """Masked-LM cross entropy over the used prediction slots (label [PAD] marks an unused one), plus NSP."""
    import keras

    from models import LabelSmoothedCrossEntropy

    losses = {"mlm_logits": LabelSmoothedCrossEntropy(0.0, pad_id=bert_data.PAD)}
    if args.nsp:
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


def load_bert_checkpoint(path):
    """A BertMaskedLM checkpoint of this script (model and optimizer state)."""
    from models import BertMaskedLM

    return load_checkpoint(path, expect=BertMaskedLM)


# --- pretraining ----------------------------------------------------------------------------------

def run_name(args):
    warm = "nowarmup" if args.no_warmup else f"warmup{args.warmup_steps}"
    return f"bert-{args.norm}-{warm}-lr{args.lr:g}-{args.preset}"


def train(args):
    """One pretraining run as `args` say, on the devices `distribution.configure` picks."""
    setup = distribution.configure(args)
    if args.batch_size % setup.replicas:
        raise UsageError(f"--batch-size {args.batch_size} must be a multiple of the {setup.replicas} data-parallel "
                         "replicas; change it or --distribute")
    with setup.scope():
        return _train(args, setup)


def _train(args, setup):
    import keras

    from callbacks import Counter, Divergence, ProgressLog, Run, StepBackup, StepBatches, Validation, fit
    from models import BertMaskedLM

    out, state_path = open_run_dir(default_out(args), args.resume, "checkpoint")
    config_path = os.path.join(out, "config.json")
    original = json.load(open(config_path)) if args.resume else dict(steps=args.steps)
    if original["steps"] != args.steps:
        raise UsageError(f"--resume: {out} was started with --steps {original['steps']}; resume with the same flags "
                         "(--max-updates stops a run early)")
    schedule = bert_schedule(args.lr, 0 if args.no_warmup else args.warmup_steps, args.steps)
    keras.utils.set_random_seed(args.seed)
    vocab_file = os.path.join(out, original["tokenizer"]) if args.resume else args.vocab  # a resumed run keeps its own
    data = load_data(args, os.path.join(out, "vocab"), vocab_file)
    rows, updates, elapsed, loss_state = [], 0, 0.0, None
    if args.resume:
        state = json.load(open(state_path))
        # The newest checkpoint that loads (a corrupt one is skipped with a warning); rows after it are redone.
        updates, model, _ = load_latest_checkpoint(os.path.join(out, "checkpoints"), upto=state["updates"],
                                                   prefix="step", expect=BertMaskedLM)
        exclude_from_decay(model.optimizer)
        elapsed = state["elapsed_s"] if updates == state["updates"] else 0.0
        loss_state = state.get("loss_state") if updates == state["updates"] else None
        rows = [r for r in read_csv(os.path.join(out, "metrics.csv")) if int(r["updates"]) <= updates]
        print(f"resuming {out} at update {updates}")
    else:
        model = build_model(args, data["vocab_size"])
        model.compile(optimizer=make_optimizer(args, schedule), loss=pretraining_losses(args),
                      jit_compile=distribution.compile_xla(setup))
        write_json(config_path, run_config(args, dict(
            data=data["description"], vocab_size=data["vocab_size"], run_dir=out,
            tokenizer=os.path.relpath(data["tokenizer_path"], out), parameters=model.count_params(),
            schedule=keras.saving.serialize_keras_object(schedule))))
    print(f"{run_name(args)}: {model.count_params():,} parameters, {args.steps} updates of {args.batch_size} "
          f"sequences; {setup.description}, {args.precision}; run directory {out}")
    stop = min(args.steps, args.max_updates) if args.max_updates else args.steps
    progress = Progress(stop, start=updates, every=args.log_every)
    started = time.time() - elapsed
    run = Run(updates, rows, outcome="finished" if stop == args.steps else "stopped", stop=stop, loss_state=loss_state)
    setup.build(model, training_batch(args, data["train"], data["vocab_size"], updates))

    def validate(model, train_loss, tokens_per_s):
        row = dict(updates=run.updates, lr=lr_at(schedule, run.updates - 1), train_loss=train_loss,
                   **evaluate(model, data["valid"], setup), elapsed_s=round(time.time() - started, 1), outcome="ok")
        run.rows.append(row)
        write_csv(os.path.join(out, "metrics.csv"), run.rows)
        print(f"update {row['updates']}: lr {row['lr']:.2e}, train loss {row['train_loss']:.3f}, valid loss "
              f"{row['valid_loss']:.3f}, valid accuracy {row['valid_accuracy']:.3f}, {row['elapsed_s']:.0f}s", flush=True)

    def diverged(value):
        run.rows.append(dict(updates=run.updates, lr=lr_at(schedule, run.updates - 1), train_loss=value,
                             valid_loss=float("nan"), valid_accuracy=float("nan"), outcome="diverged"))
        write_csv(os.path.join(out, "metrics.csv"), run.rows)
        print(f"\nupdate {run.updates}: the loss became {value}: the run diverged (a result for this paper, not a "
              "crash); recorded in metrics.csv and results.json")

    # The batch of update i + 1 is a function of (--seed, i): a resumed run goes on with the next one.
    dataset = StepBatches(lambda step: training_batch(args, data["train"], data["vocab_size"], step), updates, stop,
                          pad=setup.pad, count_tokens=lambda batch: int(np.sum(batch[0]["token_ids"] != bert_data.PAD)))
    fit(model, dataset, run, epochs=1, callbacks=[
        Counter(run, dataset),
        Divergence(run, diverged),
        ProgressLog(run, progress, lambda step: lr_at(schedule, step), dataset),
        Validation(run, validate, lambda now, last: now % args.eval_every == 0 or now == stop, progress),
        StepBackup(run, os.path.join(out, "checkpoints"), state_path, name=lambda run: f"step{run.updates}",
                   due=lambda run: run.updates % args.save_every == 0 or run.updates == stop,
                   state=lambda run, path, loss_state: dict(updates=run.updates, checkpoint=path, loss_state=loss_state,
                                                            elapsed_s=round(time.time() - started, 1))),
    ])
    rows, updates, outcome = run.rows, run.updates, run.outcome
    valid = [r for r in rows if is_finite(r["valid_loss"])]
    result = dict(run=run_name(args), out=out, outcome=outcome, updates=updates, norm=args.norm, lr=args.lr,
                  warmup_steps=0 if args.no_warmup else args.warmup_steps, data=data["description"],
                  final_valid_loss=float(valid[-1]["valid_loss"]) if valid else None,
                  final_valid_accuracy=float(valid[-1]["valid_accuracy"]) if valid else None,
                  best_valid_loss=min((float(r["valid_loss"]) for r in valid), default=None),
                  elapsed_s=round(time.time() - started, 1))
    write_json(os.path.join(out, "results.json"), result)
    plot_panels(os.path.join(out, "curves.png"), "updates", _loss_panels({run_name(args): rows}))
    return result


# --- Figure 5(a): the sweep -----------------------------------------------------------------------

def first_reaching(rows, target):
    """The first update whose validation loss is at most `target`, or None."""
    return next((int(r["updates"]) for r in rows if is_finite(r["valid_loss"]) and float(r["valid_loss"]) <= target),
                None)


def speedup(post_rows, pre_rows):
    """Figure 5(a)'s measure: the update at which Pre-LN first reaches Post-LN's final validation loss.

    speed-up = (update at which Post-LN reaches it) / (update at which Pre-LN does) - 1;
    the paper: 700k / 500k - 1 = 40 %.
    """
    finite = [r for r in post_rows if is_finite(r["valid_loss"])]
    if not finite:
        return dict(target_loss=None, post_update=None, pre_update=None, speedup=None)
    target = float(finite[-1]["valid_loss"])
    post, pre = first_reaching(post_rows, target), first_reaching(pre_rows, target)
    return dict(target_loss=target, post_update=post, pre_update=pre, speedup=post / pre - 1 if pre else None)


def sweep(args, argv):
    out = prepare_out_dir(default_out(args))
    base = _strip(argv, {"--sweep": 1, "--out": 1, "--recipe": 1, "--norm": 1, "--lr": 1, "--no-warmup": 0,
                         "--resume": 0, "--vocab": 1})
    results, curves, vocab = [], {}, []
    for name, extra in SWEEPS[args.sweep]:
        run_dir = os.path.join(out, name)
        resume = ["--resume"] if args.resume and os.path.exists(os.path.join(run_dir, "state.json")) else []
        run_args = parse_args(base + extra + ["--out", run_dir] + resume + vocab)
        check_args(run_args)
        done = os.path.join(run_dir, "results.json")
        finished = os.path.exists(done) and json.load(open(done))["outcome"] != "stopped"
        print(f"== {name}" + (f": done already ({run_dir})" if finished else ""))
        results.append(json.load(open(done)) if finished else train(run_args))
        curves[name] = read_csv(os.path.join(run_dir, "metrics.csv"))
        if not vocab:  # the WordPiece trainer is not deterministic: the later runs take the first one's vocabulary
            tokenizer = json.load(open(os.path.join(run_dir, "config.json")))["tokenizer"]
            vocab = ["--vocab", os.path.join(run_dir, tokenizer)]
    names = [name for name, _ in SWEEPS[args.sweep]]
    gain = speedup(curves[names[0]], curves[names[1]])
    table = [dict(run=name, outcome=r["outcome"], updates=r["updates"], final_valid_loss=r["final_valid_loss"],
                  final_valid_accuracy=r["final_valid_accuracy"], minutes=round(r["elapsed_s"] / 60, 1))
             for name, r in zip(names, results)]
    write_csv(os.path.join(out, "results.csv"), table)
    write_csv(os.path.join(out, "curves.csv"), [dict(run=name, **{k: r[k] for k in ("updates", "lr", "valid_loss",
                                                                                 "valid_accuracy")})
                                                for name, rows in curves.items() for r in rows])
    write_json(os.path.join(out, "speedup.json"), gain)
    plot_panels(os.path.join(out, "curves.png"), "updates", _loss_panels(curves))
    print(f"\n{'run':<16} {'outcome':<9} {'updates':>7} {'valid loss':>10} {'accuracy':>8} {'minutes':>7}")
    for row in table:
        loss = f"{row['final_valid_loss']:.3f}" if row["final_valid_loss"] is not None else "-"
        accuracy = f"{row['final_valid_accuracy']:.3f}" if row["final_valid_accuracy"] is not None else "-"
        print(f"{row['run']:<16} {row['outcome']:<9} {row['updates']:>7} {loss:>10} {accuracy:>8} {row['minutes']:>7}")
    if gain["pre_update"]:
        print(f"speed-up: Pre-LN reaches Post-LN's final validation loss {gain['target_loss']:.3f} at update "
              f"{gain['pre_update']}, Post-LN at {gain['post_update']}: {100 * gain['speedup']:.0f} % faster")
    else:
        print("speed-up: Pre-LN never reached Post-LN's final validation loss")
    print(f"overlay plot: {os.path.join(out, 'curves.png')}")
    return table, gain


# --- fine-tuning (Figure 5(b, c)) -----------------------------------------------------------------

def sentence_pair_classifier(encoder, seq_len, num_labels=2, dropout=0.1):
    """BERT's sentence-pair classifier on a pretrained encoder (Devlin et al. 2019, Section 4.1):

        h = Encoder([CLS] a [SEP] b [SEP])[:, 0]                 (the [CLS] state)
        logits = W_c drop(tanh(W_p h + b_p)) + b_c               (a new pooler and classifier)

    A functional model over `encoder.encode`: it shares the encoder's embedding and blocks, and leaves
    out the pretraining heads (masked LM, NSP). The pooler and classifier are named "pooler" and
    "classifier" (`finetune_seed` re-initialises them).
    """
    import keras

    init = keras.initializers.TruncatedNormal(stddev=0.02)
    pooler = keras.layers.Dense(encoder.d_model, activation="tanh", kernel_initializer=init, name="pooler")
    classifier = keras.layers.Dense(num_labels, kernel_initializer=init, name="classifier")
    token_ids = keras.Input((seq_len,), dtype="int32", name="token_ids")
    segment_ids = keras.Input((seq_len,), dtype="int32", name="segment_ids")
    h = encoder.encode(token_ids, segment_ids)[:, 0]
    logits = classifier(keras.layers.Dropout(dropout)(pooler(h)))
    return keras.Model({"token_ids": token_ids, "segment_ids": segment_ids}, logits, name="sentence_pair_classifier")


def confidence_interval(values, level=0.95):
    """(mean, half-width) of the t-interval: mean +- t_{(1+level)/2, n-1} s / sqrt(n), s the sample std."""
    from scipy import stats

    values = np.asarray(values, "float64")
    if len(values) < 2:
        return float(values.mean()), float("nan")
    return float(values.mean()), float(stats.t.ppf((1 + level) / 2, len(values) - 1) * values.std(ddof=1)
                                       / math.sqrt(len(values)))


def checkpoint_paths(inits):
    """--init values -> .keras files; a run directory gives all its checkpoints/stepN.keras, by N."""
    paths = []
    for path in inits:
        folder = os.path.join(path, "checkpoints") if os.path.isdir(os.path.join(path, "checkpoints")) else path
        if os.path.isdir(folder):
            found = sorted((f for f in os.listdir(folder) if f.startswith("step") and f.endswith(".keras")),
                           key=lambda f: int(f[4:-6]))
            if not found:
                raise UsageError(f"--init {path}: no checkpoints/stepN.keras inside; pass a pretrain_bert.py run")
            paths += [os.path.join(folder, f) for f in found]
        else:
            paths.append(path)
    return paths


def pretrained_config(path):
    """The checkpoint's model config and its run directory's tokenizer path, checked before any training."""
    if not os.path.isfile(path):
        raise UsageError(f"--init {path}: file not found")
    try:
        with zipfile.ZipFile(path) as archive:
            saved = json.loads(archive.read("config.json"))
    except (zipfile.BadZipFile, KeyError, ValueError):
        raise UsageError(f"--init {path}: not a Keras .keras file; pass a checkpoint of pretrain_bert.py") from None
    if saved.get("class_name") != "BertMaskedLM":
        raise UsageError(f"--init {path}: a {saved.get('class_name')} checkpoint, another architecture; fine-tuning "
                         "needs a BertMaskedLM checkpoint of pretrain_bert.py (runs/NAME/checkpoints/stepN.keras)")
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    run_config_path = os.path.join(run_dir, "config.json")
    if not os.path.isfile(run_config_path) or "tokenizer" not in json.load(open(run_config_path)):
        raise UsageError(f"--init {path}: {run_config_path} names no tokenizer; the checkpoint must stay in its "
                         "pretrain_bert.py run directory (RUN/checkpoints/, RUN/vocab/)")
    tokenizer_path = os.path.join(run_dir, json.load(open(run_config_path))["tokenizer"])
    return saved["config"], tokenizer_path, os.path.basename(run_dir)


def compiled_classifier(args, config, train_rows, setup):
    """The classifier for encoders of one architecture (`config`), compiled once: `finetune_seed` resets it.

    AdamW with BERT's fine-tuning schedule: linear warmup over the first 10 % of the updates, then
    linear decay to 0.
    """
    import keras

    from models import BertMaskedLM

    encoder = BertMaskedLM.from_config(config)
    encoder.build()
    model = sentence_pair_classifier(encoder, args.seq_len)
    total = args.epochs * max(1, train_rows // args.batch_size)
    schedule = bert_schedule(args.lr, round(FINETUNE_WARMUP * total), total)
    model.compile(optimizer=make_optimizer(args, schedule),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=distribution.compile_xla(setup))
    return model, encoder


def finetune_seed(args, classifier, weights, train, dev, seed):
    """Fine-tune from the pretrained `weights` with one seed: dev accuracy after each epoch.

    The seed draws the new pooler and classifier (truncated normal, std 0.02) and the order of the
    training pairs; the optimizer starts afresh (its step count and moments set to 0).
    """
    import keras

    model, encoder = classifier
    keras.utils.set_random_seed(seed)
    encoder.set_weights(weights)
    init = keras.initializers.TruncatedNormal(stddev=0.02, seed=seed)
    for layer in (model.get_layer("pooler"), model.get_layer("classifier")):
        layer.kernel.assign(init(layer.kernel.shape))
        layer.bias.assign(keras.ops.zeros(layer.bias.shape))
    for variable in model.optimizer.variables:
        variable.assign(keras.ops.zeros(variable.shape, variable.dtype))
    per_epoch = max(1, len(train[0]) // args.batch_size)
    accuracies = []
    for epoch in range(args.epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(train[0]))
        losses = []
        for rows, _ in _batch_rows(len(order), args.batch_size)[:per_epoch]:
            batch = order[rows]
            losses.append(float(np.asarray(model.train_on_batch(
                {"token_ids": train[0][batch], "segment_ids": train[1][batch]}, train[2][batch]))))
        correct = 0
        for rows, real in _batch_rows(len(dev[0]), args.batch_size):
            logits = model.predict_on_batch({"token_ids": dev[0][rows], "segment_ids": dev[1][rows]})
            correct += int((np.asarray(logits)[:real].argmax(-1) == dev[2][rows][:real]).sum())
        accuracies.append(dict(epoch=epoch + 1, train_loss=float(np.mean(losses)), dev_accuracy=correct / len(dev[0])))
    return accuracies


def finetune(args):
    if args.distribute in ("data", "model"):
        raise UsageError(f"--finetune runs on one device (GLUE tasks are small); drop --distribute {args.distribute}")
    setup = distribution.configure(argparse.Namespace(**dict(vars(args), distribute="none")))  # one device, --precision
    checkpoints = checkpoint_paths(args.init)
    configs = [pretrained_config(path) for path in checkpoints]  # every --init checked before any training
    glue = bert_data.read_glue(args.glue_dir, args.finetune)
    out = prepare_out_dir(default_out(args))
    write_json(os.path.join(out, "config.json"), run_config(args, dict(checkpoints=checkpoints)))
    task = bert_data.GLUE_TASKS[args.finetune]["name"]
    print(f"{task}: {len(glue['train'])} training and {len(glue['dev'])} dev pairs; {len(checkpoints)} checkpoints "
          f"x {args.seeds} seeds, {args.epochs} epochs, batch {args.batch_size}, lr {args.lr:g}")
    epoch_rows, summary, classifiers = [], [], {}
    for path, (config, tokenizer_path, run) in zip(checkpoints, configs):
        tokenizer = bert_data.load_tokenizer(tokenizer_path)
        if tokenizer.get_vocab_size() != config["vocab_size"]:
            raise UsageError(f"--init {path}: the model has {config['vocab_size']} word pieces but {tokenizer_path} "
                             f"{tokenizer.get_vocab_size()}; the checkpoint and its run directory do not match")
        if args.seq_len > config["max_positions"]:
            raise UsageError(f"--seq-len {args.seq_len} is longer than the checkpoint's {config['max_positions']} "
                             "positions")
        pretrained = load_bert_checkpoint(path)
        updates = int(np.asarray(pretrained.optimizer.iterations)) if pretrained.optimizer else None
        train, dev = (bert_data.encode_sentence_pairs(glue[s], tokenizer, args.seq_len) for s in ("train", "dev"))
        architecture = json.dumps({k: v for k, v in config.items() if k != "name"}, sort_keys=True, default=str)
        if architecture not in classifiers:  # one compilation per architecture (Post-LN, Pre-LN, ...)
            classifiers[architecture] = compiled_classifier(args, config, len(train[0]), setup)
        finals = []
        for seed in range(1, args.seeds + 1):
            epochs = finetune_seed(args, classifiers[architecture], pretrained.get_weights(), train, dev, seed)
            epoch_rows += [dict(checkpoint=path, run=run, pretraining_updates=updates, seed=seed, **e) for e in epochs]
            finals.append(epochs[-1]["dev_accuracy"])
            write_csv(os.path.join(out, "finetune.csv"), epoch_rows)
        mean, half = confidence_interval(finals)
        summary.append(dict(checkpoint=path, run=run, pretraining_updates=updates, seeds=len(finals),
                            dev_accuracy_mean=mean, dev_accuracy_ci95=half,
                            accuracies=" ".join(f"{a:.4f}" for a in finals)))
        write_csv(os.path.join(out, "results.csv"), summary)
        print(f"{run} update {updates}: {task} dev accuracy {100 * mean:.2f} +- {100 * half:.2f} "
              f"(95 % CI over {len(finals)} seeds)", flush=True)
    runs = {}
    for row in summary:
        xs, ys, errs = runs.setdefault(row["run"], ([], [], []))
        xs.append(row["pretraining_updates"] or 0)
        ys.append(row["dev_accuracy_mean"])
        errs.append(row["dev_accuracy_ci95"])
    plot_panels(os.path.join(out, "finetune.png"), "pretraining updates", [(f"{task} dev accuracy", runs)])
    write_json(os.path.join(out, "results.json"), dict(task=task, seeds=args.seeds, epochs=args.epochs, lr=args.lr,
                                                       batch_size=args.batch_size, checkpoints=summary))
    return summary


# --- plots ----------------------------------------------------------------------------------------

def _loss_panels(curves):
    """Validation loss and accuracy against updates, one line a run (rows of metrics.csv)."""
    panels = []
    for key, label in (("valid_loss", "validation masked-LM loss"),
                       ("valid_accuracy", "validation masked-LM accuracy")):
        lines = {}
        for name, rows in curves.items():
            rows = [r for r in rows if is_finite(r[key])]
            lines[name] = ([int(r["updates"]) for r in rows], [float(r[key]) for r in rows], None)
        panels.append((label, lines))
    return panels


def dispatch(args, argv):
    if args.finetune:
        return finetune(args)
    if args.sweep:
        return sweep(args, argv)
    return train(args)


def default_out(args):
    """The directory a command writes: --out, or one under runs/ named after the job."""
    return args.out or os.path.join("runs", f"finetune-{args.finetune}" if args.finetune else
                                    f"sweep-{args.sweep}-{args.preset}" if args.sweep else run_name(args))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_script("pretrain_bert.py", argv, parse_args, check_args, lambda args: dispatch(args, argv),
                      out_dir=default_out, errors=(DataError,))


if __name__ == "__main__":
    sys.exit(main())
