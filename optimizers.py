"""Optimizers of the paper that Keras lacks, as Keras 3 optimizers (keras.ops only).

RAdam (Liu et al. 2019) is the paper's warmup-free baseline: Xiong et al. (Section 4) show that
with RAdam the Post-LN Transformer trains without the learning-rate warmup stage.

    make_optimizer(spec.optimization, schedule)   # --optimizer adam | sgd | radam, the paper's betas
    bert_optimizer(spec.optimization, schedule)   # BERT's AdamW: no decay on LayerNorm's gamma, beta and biases
"""

import math

import keras
from keras import ops

_PACKAGE = "lnplace"

# Below this x = t * ln(1 / beta_2) the SMA length is computed from its series (see approx_sma_length).
_SERIES_BELOW = 0.5


def _check(name, value, low, high=None, low_open=False):
    """value must be a real number in [low, high) (or (low, high) with low_open)."""
    bad_type = isinstance(value, bool) or not isinstance(value, (int, float))
    if bad_type or (value <= low if low_open else value < low) or (high is not None and value >= high):
        interval = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'})"
        raise ValueError(f"{name} must be a number in {interval}, got {value!r}.")


def approx_sma_length(t, beta_2):
    """rho_t = rho_inf - 2 t beta_2^t / (1 - beta_2^t), rho_inf = 2 / (1 - beta_2) - 1 (float32 tensor).

    `t` is the 1-based step (a tensor or number), `beta_2` a Python float. Evaluated as written in
    float32, rho_t loses ~3 digits to cancellation (2 / (1 - beta_2) - 2 t beta_2^t / (1 - beta_2^t)),
    about 0.04 at beta_2 = 0.999 and 3 at beta_2 = 0.9999 -- enough to flip the rho_t > 4 test and to
    get r_t wrong by percents. With L = ln(1 / beta_2) and x = t L it is rewritten without cancellation:

        rho_t = rho_inf - 2 t / expm1(x)                                            (x >= 0.5)
        rho_t = C + t (1 - x / 6 + x^3 / 360 - x^5 / 15120),  C = rho_inf - 2 / L    (x < 0.5)

    (the second from x / (e^x - 1) = 1 - x/2 + x^2/12 - x^4/720 + x^6/30240 - ...; C, tiny, is
    computed in double precision), which is accurate to a few float32 ulps of rho_t.
    """
    delta = 1.0 - beta_2
    log_inv = -math.log1p(-delta)  # L = ln(1 / beta_2) > 0
    rho_inf = 2.0 / delta - 1.0
    const = rho_inf - 2.0 / log_inv  # C ~ delta / 6
    t = ops.cast(t, "float32")
    x = t * log_inv
    xs = ops.minimum(x, _SERIES_BELOW)  # keeps the unused branch finite
    series = const + t * (1.0 - xs / 6.0 + xs**3 / 360.0 - xs**5 / 15120.0)
    direct = rho_inf - 2.0 * t / ops.expm1(ops.maximum(x, _SERIES_BELOW))
    return ops.where(x < _SERIES_BELOW, series, direct)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class RAdam(keras.optimizers.Optimizer):
    """Rectified Adam (Liu et al. 2019, "On the Variance of the Adaptive Learning Rate and Beyond", Alg. 2).

    Why here: Xiong et al. (Section 4) show RAdam lets Post-LN train without learning-rate warmup.

    With g_t the gradient and t = 1, 2, ... the step (`iterations + 1`):

        m_t     = beta_1 m_{t-1} + (1 - beta_1) g_t
        v_t     = beta_2 v_{t-1} + (1 - beta_2) g_t^2
        m_hat_t = m_t / (1 - beta_1^t)
        rho_inf = 2 / (1 - beta_2) - 1
        rho_t   = rho_inf - 2 t beta_2^t / (1 - beta_2^t)
        if rho_t > 4:                                        (variance of the adaptive lr is tractable)
            l_t     = sqrt(1 - beta_2^t) / (sqrt(v_t) + epsilon)
            r_t     = sqrt( (rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t) )
            theta_t = theta_{t-1} - lr_t r_t m_hat_t l_t
        else:                                                (momentum SGD, no adaptive lr)
            theta_t = theta_{t-1} - lr_t m_hat_t

    The threshold 4 is the paper's Algorithm 2 (`rectification_threshold`; some implementations use
    5, e.g. PyTorch's RAdam and the authors' released code); it must be >= 4, where r_t is defined.
    With beta_2 = 0.999, rho_t <= 4 for t <= 4: the first 4 steps are momentum SGD. epsilon is
    added to sqrt(v_t) before the bias correction, like Keras's Adam. rho_t is evaluated without
    float32 cancellation (see `approx_sma_length`). Both branches are computed and one is selected
    with `ops.where`, so the step traces in compiled train steps on every backend.

    Args:
        learning_rate: a float or a `keras.optimizers.schedules.LearningRateSchedule` (lr_t).
        beta_1: decay rate of the first moment, in [0, 1).
        beta_2: decay rate of the second moment, in (0, 1).
        epsilon: added to sqrt(v_t), >= 0.
        rectification_threshold: the rectified (adaptive) update is used when rho_t > this; >= 4.
        **kwargs: base optimizer arguments (weight_decay, clipnorm, clipvalue, global_clipnorm,
            use_ema, gradient_accumulation_steps, name, ...). weight_decay is decoupled
            (theta <- theta - lr_t * weight_decay * theta before the step), as in Keras's AdamW.
    """

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 rectification_threshold=4.0, **kwargs):
        _check("beta_1", beta_1, 0.0, 1.0)
        _check("beta_2", beta_2, 0.0, 1.0, low_open=True)
        _check("epsilon", epsilon, 0.0)
        _check("rectification_threshold", rectification_threshold, 4.0)
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta_1, self.beta_2 = float(beta_1), float(beta_2)
        self.epsilon = float(epsilon)
        self.rectification_threshold = float(rectification_threshold)

    def build(self, var_list):
        """One first-moment ("momentum") and one second-moment ("velocity") slot per variable."""
        if self.built:
            return
        super().build(var_list)
        self._momentums, self._velocities = [], []
        for variable in var_list:
            if self._overwrite_variable_with_gradient(variable):  # never updated by update_step
                self._momentums.append(None)
                self._velocities.append(None)
            else:
                self._momentums.append(self.add_variable_from_reference(variable, "momentum"))
                self._velocities.append(self.add_variable_from_reference(variable, "velocity"))

    def _step_terms(self, dtype):
        """(1 - beta_1^t, sqrt(1 - beta_2^t) r_t, rho_t > threshold) for the current step."""
        compute = "float64" if dtype == "float64" else "float32"
        t = ops.cast(self.iterations + 1, compute)
        # 1 - beta^t = -expm1(t ln beta): no cancellation for beta close to 1.
        bias_1 = -ops.expm1(t * math.log(self.beta_1)) if self.beta_1 > 0 else ops.ones_like(t)
        bias_2 = -ops.expm1(t * math.log(self.beta_2))
        rho = ops.cast(approx_sma_length(t, self.beta_2), compute)
        rho_inf = 2.0 / (1.0 - self.beta_2) - 1.0
        # rho_inf / ((rho_inf - 4)(rho_inf - 2)); 0 if rho_t can never pass the threshold (r unused).
        k = rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0)) if rho_inf > self.rectification_threshold else 0.0
        rho_c = ops.maximum(rho, 4.0)  # r_t only used where rho_t > threshold >= 4; keeps it finite
        r = ops.sqrt(k * (rho_c - 4.0) * (rho_c - 2.0) / rho_c)
        rectified = rho > self.rectification_threshold
        return (ops.cast(bias_1, dtype), ops.cast(ops.sqrt(bias_2) * r, dtype), rectified)

    def update_step(self, gradient, variable, learning_rate):
        """One RAdam step on `variable` (see the class docstring)."""
        lr = ops.cast(learning_rate, variable.dtype)
        gradient = ops.cast(gradient, variable.dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        bias_1, rect_scale, rectified = self._step_terms(variable.dtype)

        self.assign_add(m, ops.multiply(ops.subtract(gradient, m), 1.0 - self.beta_1))
        self.assign_add(v, ops.multiply(ops.subtract(ops.square(gradient), v), 1.0 - self.beta_2))

        m_hat = ops.divide(m, bias_1)
        adaptive = ops.divide(rect_scale, ops.add(ops.sqrt(v), self.epsilon))  # r_t l_t
        scale = ops.where(rectified, adaptive, ops.ones_like(adaptive))
        self.assign_sub(variable, ops.multiply(ops.multiply(lr, m_hat), scale))

    def get_config(self):
        config = super().get_config()
        config.update({"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon,
                       "rectification_threshold": self.rectification_threshold})
        return config


# --- the optimizers of the scripts' --optimizer -------------------------------------------------------------

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
