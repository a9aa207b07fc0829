"""Learning-rate schedules of the paper, as Keras `LearningRateSchedule`s (keras.ops only).

Step counting. Keras calls a schedule with `step` = the number of updates already made (0 for the
first update). Every schedule here uses the 1-based update index

    t = step + 1

so "the t-th update uses lr(t)", as in the paper's eq. 1. With warmup T, the first update uses
lr_max / T and update T uses lr_max; `warmup_steps=1` (the paper's "no warmup") and
`warmup_steps=0` both start at lr_max.

Recipes (see each class):
    fairseq inverse_sqrt, warmup 4000:  LinearWarmup(4000, InverseSquareRoot(5e-4, decay_start=4000))
    Figure 2, "warmup = 1":             InverseSquareRoot(5e-4, decay_start=1)
    Pre-LN IWSLT (x0.1 at epoch 8):     StepDecay(5e-4, boundaries=[8 * steps_per_epoch], factor=0.1)
    35.5-BLEU setting:                  InverseSquareRoot(7.5e-4, decay_start=8000)
    BERT Post-LN:                       LinearWarmup(10000, LinearDecay(1e-4, total, decay_start=10000))
    BERT Pre-LN:                        LinearDecay(3e-4, total)

`make_schedule(name, lr, warmup, total)` builds each of them from a name (the scripts' --schedule).
"""

import keras
from keras import ops

_PACKAGE = "lnplace"


def _update_index(step):
    """Keras's 0-based step -> the 1-based index t of the update being made (float32)."""
    return ops.cast(step, "float32") + 1.0


def _check(name, value, minimum=0.0, strict=False):
    bad = value <= minimum if strict else value < minimum
    if isinstance(value, bool) or not isinstance(value, (int, float)) or bad:
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be a number {relation} {minimum}, got {value!r}.")


def _value(schedule, step):
    return schedule(step) if callable(schedule) else ops.convert_to_tensor(schedule, "float32")


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LinearWarmup(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup into another schedule (Xiong et al., eq. 1):

        lr(t) = initial_lr + (lr_max - initial_lr) * t / T     for t < T
        lr(t) = after(t)                                        for t >= T,    lr_max = after(T)

    `after` is a LearningRateSchedule (or a constant lr) defined on the same global step, so the
    warmup ends exactly where the decay begins. `warmup_steps=0` is `after` itself.
    """

    def __init__(self, warmup_steps, after, initial_lr=0.0):
        _check("warmup_steps", warmup_steps)
        _check("initial_lr", initial_lr)
        if isinstance(after, (int, float)):
            _check("the learning rate after warmup", after, strict=True)
        elif not isinstance(after, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(f"after must be a LearningRateSchedule or a number, got {after!r}.")
        self.warmup_steps, self.after, self.initial_lr = warmup_steps, after, float(initial_lr)

    def __call__(self, step):
        t = _update_index(step)
        after = _value(self.after, step)
        if self.warmup_steps == 0:
            return after
        peak = _value(self.after, self.warmup_steps - 1)  # after(T), as a 0-based step
        warm = self.initial_lr + (peak - self.initial_lr) * t / float(self.warmup_steps)
        return ops.where(t < self.warmup_steps, warm, after)

    def get_config(self):
        after = self.after
        if not isinstance(after, (int, float)):
            after = keras.saving.serialize_keras_object(after)
        return {"warmup_steps": self.warmup_steps, "after": after, "initial_lr": self.initial_lr}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config["after"], dict):
            config["after"] = keras.saving.deserialize_keras_object(config["after"])
        return cls(**config)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class InverseSquareRoot(keras.optimizers.schedules.LearningRateSchedule):
    """Constant, then inverse square root from `decay_start` on (fairseq `inverse_sqrt`):

        lr(t) = lr                                  for t < D
        lr(t) = lr * factor * sqrt(D / t)           for t >= D,     D = decay_start

    - after a warmup of T steps: `LinearWarmup(T, InverseSquareRoot(lr, decay_start=T))`;
    - the paper's "warmup = 1" (Figure 2): decay_start=1, i.e. lr / sqrt(t) from the first update;
    - "decay at a step, then inverse sqrt" (35.5-BLEU and WMT settings): decay_start = that step,
      with `factor` the drop applied there (1 = none).
    """

    def __init__(self, lr, decay_start, factor=1.0):
        _check("lr", lr, strict=True)
        _check("decay_start", decay_start, minimum=1)
        _check("factor", factor, strict=True)
        self.lr, self.decay_start, self.factor = float(lr), decay_start, float(factor)

    def __call__(self, step):
        t = _update_index(step)
        decayed = self.lr * self.factor * ops.sqrt(float(self.decay_start) / ops.maximum(t, 1.0))
        return ops.where(t < self.decay_start, ops.full_like(t, self.lr), decayed)

    def get_config(self):
        return {"lr": self.lr, "decay_start": self.decay_start, "factor": self.factor}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class StepDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Piecewise constant: multiply by `factor` at each boundary (Pre-LN IWSLT: x0.1 at epoch 8).

        lr(t) = lr * factor^k,    k = #{b in boundaries : t > b}

    Boundaries count updates: with boundaries=[B], updates 1..B use lr and update B + 1 on uses
    lr * factor (so "decay after epoch 8" is B = 8 * updates_per_epoch).
    """

    def __init__(self, lr, boundaries, factor=0.1):
        _check("lr", lr, strict=True)
        _check("factor", factor, strict=True)
        boundaries = list(boundaries)
        for b in boundaries:
            _check("each boundary", b, minimum=1)
        if boundaries != sorted(boundaries):
            raise ValueError(f"boundaries must be increasing, got {boundaries}.")
        self.lr, self.boundaries, self.factor = float(lr), boundaries, float(factor)

    def __call__(self, step):
        t = _update_index(step)
        k = ops.zeros_like(t)
        for b in self.boundaries:
            k = k + ops.cast(t > b, "float32")
        return self.lr * ops.power(self.factor, k)

    def get_config(self):
        return {"lr": self.lr, "boundaries": self.boundaries, "factor": self.factor}


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LinearDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear decay to `end_lr` at `total_steps` (BERT; RAdam runs in the paper):

        lr(t) = lr                                                    for t <= S
        lr(t) = end_lr + (lr - end_lr) * (N - t) / (N - S)            for S < t <= N
        lr(t) = end_lr                                                for t > N

    N = total_steps, S = decay_start (0 without warmup; the warmup length T after
    `LinearWarmup(T, LinearDecay(lr, N, decay_start=T))`).
    """

    def __init__(self, lr, total_steps, decay_start=0, end_lr=0.0):
        _check("lr", lr, strict=True)
        _check("total_steps", total_steps, minimum=1)
        _check("decay_start", decay_start)
        _check("end_lr", end_lr)
        if decay_start >= total_steps:
            raise ValueError(f"decay_start ({decay_start}) must be smaller than total_steps ({total_steps}); "
                             "is the warmup longer than training?")
        self.lr, self.total_steps = float(lr), total_steps
        self.decay_start, self.end_lr = decay_start, float(end_lr)

    def __call__(self, step):
        t = _update_index(step)
        n, s = float(self.total_steps), float(self.decay_start)
        fraction = ops.clip((n - t) / (n - s), 0.0, 1.0)
        return self.end_lr + (self.lr - self.end_lr) * fraction

    def get_config(self):
        return {"lr": self.lr, "total_steps": self.total_steps, "decay_start": self.decay_start,
                "end_lr": self.end_lr}


def make_schedule(name, lr, warmup, total, decay_step=0, decay_factor=0.1):
    """The schedule called `name` (the scripts' --schedule), t the update index and N = `total` (None: not
    known, for a schedule that does not need it):

        warmup, if `warmup` > 0:  lr t / T_warmup  for t < T_warmup, then
        inverse_sqrt              lr sqrt(max(T_warmup, 1) / t)   (the paper's "warmup = 1" without warmup)
        step                      lr, times `decay_factor` from update `decay_step` on
        decay_then_inverse_sqrt   lr until `decay_step`, then `decay_factor` lr sqrt(decay_step / t)
        linear                    lr (N - t) / (N - T_warmup)      (BERT's recipes, Figure 4's RAdam)
        constant                  lr
    """
    if warmup and total is not None and warmup >= total:
        raise ValueError(f"warmup ({warmup}) must be shorter than training ({total} updates)")
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
