"""The optimizer and learning-rate schedule that the scripts' flags ask for (optimizers.py, schedules.py).

    schedule = make_schedule(spec, updates_per_epoch, total_updates)   # the spec's schedule (train_nmt.py)
    optimizer = make_optimizer(args, schedule)                          # --optimizer adam | sgd | radam
    lr_at(schedule, step)                                               # the rate of update step + 1
    bert_optimizer(args, bert_schedule(lr, warmup_steps, total_steps))  # pretrain_bert.py's and harness/glue.py's

The flags' names (`OPTIMIZERS`, `SCHEDULES`) are in harness/constants.py; which schedule a run has, with or
without warmup, is decided once, when its spec is built (`specs.TranslationSpec.build`).
"""

import keras

from harness import backend
from harness.errors import UsageError
from optimizers import RAdam
from schedules import InverseSquareRoot, LinearDecay, LinearWarmup, StepDecay


def make_schedule(args, updates_per_epoch, total_updates):
    """The learning-rate schedule of schedules.py that the spec describes (its `schedule`, decided when
    the spec was built)."""
    name, lr = args.schedule, args.lr
    warmup = 0 if args.no_warmup else args.warmup_steps
    if warmup and warmup >= total_updates:
        raise UsageError(f"--warmup-updates {warmup} is not shorter than training ({total_updates} updates); "
                         "lower --warmup-updates or raise --epochs / --max-updates")
    decay_step = args.decay_epoch * updates_per_epoch
    if name == "inverse_sqrt":  # the paper's "warmup = 1" when there is no warmup (Figure 2)
        after = InverseSquareRoot(lr, decay_start=max(warmup, 1))
    elif name == "step":
        after = StepDecay(lr, boundaries=[decay_step], factor=args.decay_factor)
    elif name == "decay_then_inverse_sqrt":
        after = InverseSquareRoot(lr, decay_start=max(decay_step, warmup, 1), factor=args.decay_factor)
    elif name == "linear":
        after = LinearDecay(lr, total_steps=total_updates, decay_start=warmup)
    else:
        after = lr
    return LinearWarmup(warmup, after) if warmup else after


def make_optimizer(args, schedule, betas=(0.9, 0.98), epsilon=1e-8):
    """--optimizer with the rate `schedule`: adam (Adam, or AdamW with decoupled --weight-decay), sgd
    (plain) or radam (optimizers.RAdam); the gradients clipped to global norm --clip-norm (0 = off).

    Adam and RAdam take `betas` and `epsilon`: the paper's 0.9, 0.98 and 1e-8 (fairseq's IWSLT14 recipe)
    by default (BERT's are `bert_optimizer`'s).
    """
    common = dict(learning_rate=schedule)
    if args.clip_norm:
        common["global_clipnorm"] = args.clip_norm
    if args.weight_decay:
        common["weight_decay"] = args.weight_decay
    adam = dict(beta_1=betas[0], beta_2=betas[1], epsilon=epsilon)
    if args.optimizer == "adam":
        return (keras.optimizers.AdamW if args.weight_decay else keras.optimizers.Adam)(**adam, **common)
    if args.optimizer == "sgd":
        return keras.optimizers.SGD(**common)
    return RAdam(**adam, **common)


def lr_at(schedule, step):
    """The learning rate of update step + 1 (a schedule, or a constant)."""
    return backend.schedule_rate(schedule, step) if callable(schedule) else float(schedule)


# --- BERT (pretrain_bert.py, harness/glue.py): Devlin et al. 2019's recipe -----------------------------------

# Devlin's exclude_from_weight_decay, by Keras's variable names: LayerNorm's gamma and beta, every bias
# (the dense layers' and the masked-LM output's mlm_bias). Embeddings and kernels are decayed.
NO_DECAY = ("gamma", "beta", "bias")


def bert_optimizer(args, schedule):
    """BERT's optimizer (google-research/bert optimization.py, `DEVLIN`): Adam with decoupled weight decay,

        w <- w - lr_t (Adam step + weight_decay w),   Adam's betas --adam-betas, eps --adam-epsilon,

    the decay skipping LayerNorm's gamma and beta and all biases (`exclude_from_decay`), the gradients
    clipped to global norm --clip-norm. Keras's Adam keeps Adam's bias correction, which BERT's
    AdamWeightDecayOptimizer leaves out. --optimizer sgd | radam: the same decay, clipping (and betas).
    """
    return exclude_from_decay(make_optimizer(args, schedule, args.adam_betas, args.adam_epsilon))


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
    if warmup_steps >= total_steps:
        raise UsageError(f"--warmup-updates {warmup_steps} is not shorter than training ({total_steps} updates); "
                         "lower --warmup-updates or raise --total-updates")
    decay = LinearDecay(lr, total_steps, decay_start=warmup_steps)
    return LinearWarmup(warmup_steps, decay) if warmup_steps else decay
