"""The optimizer and learning-rate schedule that the scripts' flags ask for (optimizers.py, schedules.py).

    schedule = make_schedule("linear", lr, warmup, total)  # every job's schedule: translation, BERT, GLUE, analyses
    optimizer = make_optimizer(spec.optimization, schedule)  # --optimizer adam | sgd | radam
    lr_at(schedule, step)                                    # the rate of update step + 1
    bert_optimizer(spec.optimization, schedule)              # pretrain_bert.py's and harness/glue.py's

The flags' names (`OPTIMIZERS`, `SCHEDULES`) are in harness/constants.py; which schedule a run has, with or
without warmup, is decided once, when its spec is built (`specs.TranslationSpec.build`).
"""

import keras

from harness import backend
from harness.errors import UsageError
from optimizers import RAdam
from schedules import InverseSquareRoot, LinearDecay, LinearWarmup, StepDecay


def make_schedule(name, lr, warmup, total, decay_step=0, decay_factor=0.1, longer="--epochs / --max-updates"):
    """The learning-rate schedule of schedules.py, for every job (translation, BERT pretraining and
    fine-tuning, the analyses), t the update index and N = `total` (None: not known, for a schedule that does
    not need it):

        warmup, if `warmup` > 0:  lr t / T_warmup  for t < T_warmup, then
        inverse_sqrt              lr sqrt(max(T_warmup, 1) / t)   (the paper's "warmup = 1" without warmup)
        step                      lr, times `decay_factor` from update `decay_step` on
        decay_then_inverse_sqrt   lr until `decay_step`, then `decay_factor` lr sqrt(decay_step / t)
        linear                    lr (N - t) / (N - T_warmup)      (BERT's recipes, Figure 4's RAdam)
        constant                  lr

    A warmup not shorter than training is refused, naming the flags (`longer`) that lengthen it."""
    if warmup and total is not None and warmup >= total:
        raise UsageError(f"--warmup-updates {warmup} is not shorter than training ({total} updates); "
                         f"lower --warmup-updates or raise {longer}")
    if name == "inverse_sqrt":
        after = InverseSquareRoot(lr, decay_start=max(warmup, 1))
    elif name == "step":
        after = StepDecay(lr, boundaries=[decay_step], factor=decay_factor)
    elif name == "decay_then_inverse_sqrt":
        after = InverseSquareRoot(lr, decay_start=max(decay_step, warmup, 1), factor=decay_factor)
    elif name == "linear":
        after = LinearDecay(lr, total_steps=total, decay_start=warmup)
    else:
        after = lr
    return LinearWarmup(warmup, after) if warmup else after


def make_optimizer(optimization, schedule, betas=(0.9, 0.98), epsilon=1e-8):
    """--optimizer of a spec's optimization part with the rate `schedule`: adam (Adam, or AdamW with
    decoupled --weight-decay), sgd (plain) or radam (optimizers.RAdam); the gradients clipped to global norm
    --clip-norm (0 = off).

    Adam and RAdam take `betas` and `epsilon`: the paper's 0.9, 0.98 and 1e-8 (fairseq's IWSLT14 recipe)
    by default (BERT's are `bert_optimizer`'s).
    """
    common = dict(learning_rate=schedule)
    if optimization.clip_norm:
        common["global_clipnorm"] = optimization.clip_norm
    if optimization.weight_decay:
        common["weight_decay"] = optimization.weight_decay
    adam = dict(beta_1=betas[0], beta_2=betas[1], epsilon=epsilon)
    if optimization.optimizer == "adam":
        return (keras.optimizers.AdamW if optimization.weight_decay else keras.optimizers.Adam)(**adam, **common)
    if optimization.optimizer == "sgd":
        return keras.optimizers.SGD(**common)
    return RAdam(**adam, **common)


def lr_at(schedule, step):
    """The learning rate of update step + 1 (a schedule, or a constant)."""
    return backend.schedule_rate(schedule, step) if callable(schedule) else float(schedule)


# --- BERT (pretrain_bert.py, harness/glue.py): Devlin et al. 2019's recipe -----------------------------------

# Devlin's exclude_from_weight_decay, by Keras's variable names: LayerNorm's gamma and beta, every bias
# (the dense layers' and the masked-LM output's mlm_bias). Embeddings and kernels are decayed.
NO_DECAY = ("gamma", "beta", "bias")


def bert_optimizer(optimization, schedule):
    """BERT's optimizer (google-research/bert optimization.py, `DEVLIN`) of a spec's optimization part: Adam
    with decoupled weight decay,

        w <- w - lr_t (Adam step + weight_decay w),   Adam's betas --adam-betas, eps --adam-epsilon,

    the decay skipping LayerNorm's gamma and beta and all biases (`exclude_from_decay`), the gradients
    clipped to global norm --clip-norm. Keras's Adam keeps Adam's bias correction, which BERT's
    AdamWeightDecayOptimizer leaves out. --optimizer sgd | radam: the same decay, clipping (and betas).
    """
    return exclude_from_decay(make_optimizer(optimization, schedule, optimization.adam_betas,
                                             optimization.adam_epsilon))


def exclude_from_decay(optimizer):
    """No weight decay on the variables named in NO_DECAY (Devlin's exclude_from_weight_decay).

    Keras does not save this in a checkpoint's optimizer, so a loaded optimizer needs it again.
    """
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY))
    return optimizer

