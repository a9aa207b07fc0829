"""Transformer layers for the three LayerNorm placements: Post-LN, Pre-LN and DeepNorm.

References
- Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture" (Post-LN vs Pre-LN, Table 1).
- Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers" (DeepNorm).

Every class uses `keras.ops` only, so this file runs on the jax, tensorflow and torch backends.

Pasting a class into a notebook or a slide
- Start with `import keras` and `from keras import ops`, then paste, in this file's order, the definitions a
  class needs (a class named there brings its own) and the class itself; each class's `Example:` then runs.
  tests/test_paste.py does exactly that, and checks that these lists are complete and no longer than needed:
    LayerNorm:                LAYER_NORM_EPSILON, _PACKAGE
    ResidualNorm:             NORMS, LAYER_NORM_EPSILON, _PACKAGE, LayerNorm, check_norm
    MultiHeadAttention:       _PACKAGE, xavier
    FeedForward:              ACTIVATIONS, _PACKAGE, xavier, activate
    TransformerEncoderBlock:  BERT_INIT_STDDEV, ResidualNorm, bert_normal, INITIALIZERS, MultiHeadAttention,
                              FeedForward, _BlockBase
    TransformerDecoderBlock:  BERT_INIT_STDDEV, ResidualNorm, bert_normal, INITIALIZERS, causal_mask,
                              _combine_masks, MultiHeadAttention, FeedForward, _BlockBase
    ScaledTokenEmbedding:     `import math`, _PACKAGE, sinusoidal_positions
    BertEmbedding:            BERT_LAYER_NORM_EPSILON, BERT_INIT_STDDEV, _PACKAGE, bert_normal

Conventions
- Shapes: B batch, T (or Tq / Tk) sequence length, d model width, H heads, dk = d / H.
- Masks are boolean and broadcast to (B, Tq, Tk): True means "query may attend to this key".
- LayerNorm epsilon is 1e-5 (fairseq / PyTorch), not Keras's default 1e-3; BERT's is 1e-12 (Devlin et al.).
"""

import math

import keras
from keras import ops

NORMS = ("post", "pre", "deepnorm")  # ResidualNorm's placements; the command lines keep an identical copy (tested)
LAYER_NORM_EPSILON = 1e-5
BERT_LAYER_NORM_EPSILON = 1e-12  # google-research/bert modeling.py `layer_norm` (tf.contrib.layers.layer_norm)
BERT_INIT_STDDEV = 0.02  # google-research/bert modeling.py `create_initializer(initializer_range=0.02)`
ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
# fairseq's and torchscale's gain on W^Q, W^K, W^V's Xavier init (variance 1/(2d) for d x d; W^O gets gain 1),
# `TranslationTransformer`'s default `qkv_gain`.
TOOLKIT_QKV_GAIN = 2 ** -0.5
_PACKAGE = "lnplace"


@keras.saving.register_keras_serializable(package=_PACKAGE)
class LayerNorm(keras.layers.Layer):
    """Layer normalisation over the last axis (Ba et al. 2016), written out:

        mean = mean_i(x_i),   var = mean_i((x_i - mean)^2)
        y = (x - mean) / sqrt(var + eps) * gamma + beta          (mean, var and y in float32)

    gamma (ones) and beta (zeros) have the width d of the last axis; eps = 1e-5 (fairseq / PyTorch).
    Equal to `keras.layers.LayerNormalization(epsilon=eps)` to float32 round-off (tested), same weight names.
    Why not that layer: its `x * inv + (beta - mean * inv)` lets x reach y by two paths, whose backward XLA's
    CPU fusion copies into many consumers in a Pre-LN stack (4 + 4 layers, 32 sentences: 6,552 multiplies a
    train step, Post-LN 4,508); the centred form has one path (4,346; jax 0.10.2, keras 3.15.1).

    Example:

    ```python
    norm = LayerNorm(epsilon=1e-5)
    x = keras.random.normal((2, 5, 16)) * 3.0 + 1.0         # (B, T, d)
    y = norm(x)                                             # mean 0, variance 1 over d at init, (2, 5, 16)
    ```
    """

    def __init__(self, epsilon=LAYER_NORM_EPSILON, **kwargs):
        kwargs.setdefault("autocast", False)  # gamma and beta stay float32 under mixed precision, as in Keras's
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        d = input_shape[-1]
        self.gamma = self.add_weight(shape=(d,), initializer="ones", name="gamma")
        self.beta = self.add_weight(shape=(d,), initializer="zeros", name="beta")

    def call(self, x):
        x = ops.cast(x, "float32")  # statistics in float32 under mixed precision too
        centred = x - ops.mean(x, axis=-1, keepdims=True)
        variance = ops.mean(ops.square(centred), axis=-1, keepdims=True)
        y = centred * ops.rsqrt(variance + self.epsilon) * ops.cast(self.gamma, "float32")
        y = y + ops.cast(self.beta, "float32")
        return ops.cast(y, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon)
        return config


def check_norm(norm):
    """Raise a ValueError unless `norm` is one of "post", "pre", "deepnorm"."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {', '.join(map(repr, NORMS))}, got {norm!r}.")
    return norm


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ResidualNorm(keras.layers.Layer):
    """The three LayerNorm placements around one residual branch F, side by side:

        post:      x_out = LN(x + drop(F(x)))            Post-LN  (Table 1, left;  x2..x3, x5..x_{l+1})
        pre:       x_out = x + drop(F(LN(x)))            Pre-LN   (Table 1, right; x1..x3, x4..x_{l+1})
        deepnorm:  x_out = LN(alpha * x + drop(F(x)))    DeepNorm (Wang et al. 2022, eq. in Sec. 2)

    LN(v) = gamma * (v - mean(v)) / sqrt(var(v) + eps) + beta, eps = 1e-5 (`LayerNorm`).
    Post-LN is DeepNorm with alpha = 1 (and init gain beta = 1).

    Use it in two halves, so F may be anything (attention with a cache, cross-attention, FFN):

        h = residual.branch_input(x)       # LN(x) for pre, x otherwise
        x = residual(x, F(h))              # the formula above

    Example:

    ```python
    x = keras.random.normal((2, 5, 16))                     # (B, T, d)
    branch = keras.layers.Dense(16)                         # any F
    for norm in ("post", "pre", "deepnorm"):
        residual = ResidualNorm(norm, alpha=2.0 if norm == "deepnorm" else 1.0)
        y = residual(x, branch(residual.branch_input(x)))   # (2, 5, 16)
    ```
    """

    def __init__(self, norm="post", alpha=1.0, dropout=0.0, epsilon=LAYER_NORM_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.norm = check_norm(norm)
        if norm != "deepnorm" and alpha != 1.0:
            raise ValueError(f"alpha={alpha} only applies to norm='deepnorm' (got norm={norm!r}).")
        self.alpha, self.rate, self.epsilon = float(alpha), dropout, epsilon
        self.layer_norm = LayerNorm(epsilon=epsilon, dtype=self.dtype_policy, name="layer_norm")
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        if not self.layer_norm.built:
            self.layer_norm.build(input_shape)

    def branch_input(self, x):
        """What the branch F sees: LN(x) for Pre-LN, x itself for Post-LN and DeepNorm."""
        return self.layer_norm(x) if self.norm == "pre" else x

    def call(self, x, branch_output, training=None):
        fx = self.dropout(branch_output, training=training)
        if self.norm == "post":
            return self.layer_norm(x + fx)
        if self.norm == "pre":
            return x + fx
        return self.layer_norm(self.alpha * x + fx)  # deepnorm

    def get_config(self):
        config = super().get_config()
        config.update(norm=self.norm, alpha=self.alpha, dropout=self.rate, epsilon=self.epsilon)
        return config


def deepnorm_constants(encoder_layers, decoder_layers, rule="paper"):
    """DeepNorm's alpha (residual scale) and beta (init gain) for a stack of N encoder / M decoder layers.

    rule="paper" (Wang et al. 2022, Table 1):
        encoder-only (M = 0):  alpha = (2N)^(1/4),               beta = (8N)^(-1/4)
        decoder-only (N = 0):  alpha = (2M)^(1/4),               beta = (8M)^(-1/4)
        encoder-decoder:       encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16)
                               decoder alpha = (3M)^(1/4),        beta = (12M)^(-1/4)
    rule="torchscale" (the authors' released code): the same, except the encoder-decoder's encoder
        beta = 1.15 (N^4 M)^(-1/16) (its weights are divided by (N^4 M)^(1/16) / 1.15).
    rule in {"sgd", "adam", "lamb"} (Su's per-optimizer analysis, seed 002), one stack of L layers
    (encoder-only or decoder-only):
        sgd:  alpha = (2L)^(1/4), beta = (2L)^(-1/4)
        adam: alpha = (2L)^(1/2), beta = (2L)^(-1/2)
        lamb: alpha = 1,          beta = (2L)^(-1/2)

    Returns {"encoder": (alpha, beta) or None, "decoder": (alpha, beta) or None}.
    Example: deepnorm_constants(6, 6) -> encoder (1.418, 0.497), decoder (2.060, 0.343).
    """
    rules = ("paper", "torchscale", "sgd", "adam", "lamb")
    if rule not in rules:
        raise ValueError(f"rule must be one of {', '.join(map(repr, rules))}, got {rule!r}.")
    for name, value in (("encoder_layers", encoder_layers), ("decoder_layers", decoder_layers)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
    n, m = encoder_layers, decoder_layers
    if n == 0 and m == 0:
        raise ValueError("deepnorm_constants needs at least one encoder or decoder layer.")
    if rule not in ("paper", "torchscale"):
        if n and m:
            raise ValueError(f"rule={rule!r} is derived for one stack (encoder-only or decoder-only); "
                             "use rule='paper' for an encoder-decoder.")
        depth = 2 * (n or m)  # number of sub-layers
        alpha, beta = {
            "sgd": (depth**0.25, depth**-0.25),
            "adam": (depth**0.5, depth**-0.5),
            "lamb": (1.0, depth**-0.5),
        }[rule]
        stack = (alpha, beta)
        return {"encoder": stack if n else None, "decoder": stack if m else None}
    if m == 0:
        return {"encoder": ((2 * n) ** 0.25, (8 * n) ** -0.25), "decoder": None}
    if n == 0:
        return {"encoder": None, "decoder": ((2 * m) ** 0.25, (8 * m) ** -0.25)}
    return {
        "encoder": (0.81 * (n**4 * m) ** (1 / 16), (0.87 if rule == "paper" else 1.15) * (n**4 * m) ** (-1 / 16)),
        "decoder": ((3 * m) ** 0.25, (12 * m) ** -0.25),
    }


def xavier(gain=1.0, seed=None):
    """Xavier (Glorot) normal with a gain: W_ij ~ N(0, gain^2 * 2 / (fan_in + fan_out)).

    gain = 1 is the paper's initialisation (Xiong et al., Section 3.3); gain = beta is DeepNorm's
    `xavier_normal_(w, gain=beta)` for W^V, W^O, W^1, W^2. All our kernels are 2-D (d x d or
    d x ffn), so the fans are those of the full matrix.
    """
    return keras.initializers.VarianceScaling(scale=gain**2, mode="fan_avg", distribution="untruncated_normal",
                                              seed=seed)


def bert_normal(gain=1.0, seed=None):
    """BERT's initializer: W_ij ~ N(0, (0.02 gain)^2), truncated at two standard deviations.

    Devlin et al. 2019 (google-research/bert `create_initializer`), for the embeddings and every dense kernel.
    gain = beta is DeepNorm's scaling of W^V, W^O, W^1, W^2 on top of it, as in torchscale.
    """
    return keras.initializers.TruncatedNormal(stddev=BERT_INIT_STDDEV * gain, seed=seed)


INITIALIZERS = {"xavier": xavier, "bert": bert_normal}


def activate(x, activation):
    """The FFN's activation, one of ACTIVATIONS:

        relu:       max(0, x)                                          (Table 1; the translation model)
        gelu:       x Phi(x), Phi the standard normal CDF               (exact GELU, Hendrycks & Gimpel 2016)
        gelu_tanh:  0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))   (BERT's `gelu`, google-research/bert)
    """
    if activation == "relu":
        return ops.relu(x)
    return ops.gelu(x, approximate=activation == "gelu_tanh")


def padding_mask(token_ids, pad_id=0):
    """(B, T) token ids -> (B, 1, T) boolean mask, True at real tokens (keys a query may see)."""
    return ops.expand_dims(ops.not_equal(token_ids, pad_id), axis=1)


def segment_mask(query_segments, key_segments):
    """Packed rows, several sentences to a row: (B, Tq) and (B, Tk) segment ids (the sentence's number in its
    row, 0 at padding) -> (B, Tq, Tk) boolean mask, True where key j is a real token of query i's sentence:

        M[b, i, j] = (s_k[b, j] != 0) and (s_q[b, i] == s_k[b, j])

    so attention never crosses sentences and each sentence's outputs are those it would have alone in a row.
    A padding query (s_q = 0) sees no key: its scores are all masked, its softmax uniform, its output unused."""
    same = ops.equal(ops.expand_dims(query_segments, 2), ops.expand_dims(key_segments, 1))
    return ops.logical_and(same, ops.expand_dims(ops.not_equal(key_segments, 0), 1))


def causal_mask(query_length, key_length=None):
    """(1, Tq, Tk) boolean mask: query i sees keys j <= i + (Tk - Tq) (the last Tq positions)."""
    key_length = query_length if key_length is None else key_length
    q = ops.arange(query_length)[:, None] + (key_length - query_length)
    k = ops.arange(key_length)[None, :]
    return ops.expand_dims(ops.greater_equal(q, k), axis=0)


def _combine_masks(*masks):
    result = None
    for mask in masks:
        if mask is not None:
            mask = ops.cast(mask, "bool")
            result = mask if result is None else ops.logical_and(result, mask)
    return result


@keras.saving.register_keras_serializable(package=_PACKAGE)
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head scaled dot-product attention with four public projections.

        Q = x W^Q,  K = y W^K,  V = y W^V               (y = x for self-attention)
        head_h = softmax(Q_h K_h^T / sqrt(dk) + mask) V_h
        MultiHead(x, y) = concat(head_1 .. head_H) W^O

    `query_dense`, `key_dense`, `value_dense` and `output_dense` are d x d Dense layers, each with
    its own initializer (DeepNorm scales W^V and W^O by beta and leaves W^Q, W^K alone, which
    `keras.layers.MultiHeadAttention` cannot express). Biases start at zero.

    Incremental decoding: `cache` (2, B, H, L, dk) holds keys, then values, head-major, so that a decoding
    step reads them without a transpose and writes them with one slice update.
    - self-attention, `cache_update_index=i`: the Tq new keys/values are written at positions i .. i+Tq-1
      and attention runs over the whole cache (mask the unwritten positions); returns (output, updated_cache).
    - cross-attention, `cache_update_index=None`: the cached keys/values (computed once with
      `compute_key_value_cache`) are used as they are; returns (output, cache).

    Args:
        d_model: width d of inputs and outputs.
        num_heads: H; d must be divisible by H.
        attention_dropout: dropout on the attention probabilities.
        query_initializer, key_initializer, value_initializer, output_initializer: kernel inits
            (default `xavier()`, the paper's N(0, 2 / (fan_in + fan_out))).

    Example:

    ```python
    attention = MultiHeadAttention(d_model=16, num_heads=2)
    x = keras.random.normal((2, 5, 16))                     # queries (B, Tq, d)
    memory = keras.random.normal((2, 7, 16))                # keys and values (B, Tk, d)
    causal = ops.tril(ops.ones((1, 5, 5))) > 0              # (1, Tq, Tk): query i sees keys j <= i
    y = attention(x, attention_mask=causal)                 # self-attention, (2, 5, 16)
    z = attention(x, memory)                                # cross-attention, (2, 5, 16)

    # DeepNorm's initialisation: gain beta on W^V and W^O, gain 1 on W^Q and W^K.
    attention = MultiHeadAttention(16, 2, value_initializer=xavier(0.5), output_initializer=xavier(0.5))
    ```
    """

    def __init__(self, d_model, num_heads, attention_dropout=0.0, query_initializer=None, key_initializer=None,
                 value_initializer=None, output_initializer=None, **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads}).")
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
        self.attention_dropout = attention_dropout
        inits = dict(query=query_initializer, key=key_initializer, value=value_initializer, output=output_initializer)
        self.initializers = {k: keras.initializers.get(v or xavier()) for k, v in inits.items()}

        def dense(name):
            return keras.layers.Dense(d_model, kernel_initializer=self.initializers[name], bias_initializer="zeros",
                                      dtype=self.dtype_policy, name=name)

        self.query_dense = dense("query")
        self.key_dense = dense("key")
        self.value_dense = dense("value")
        self.output_dense = dense("output")
        self.dropout = keras.layers.Dropout(attention_dropout, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        self.query_dense.build(query_shape)
        self.key_dense.build(value_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(tuple(query_shape[:-1]) + (self.d_model,))

    def _split_heads(self, x):  # (B, T, d) -> (B, T, H, dk)
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1], self.num_heads, self.head_dim))

    @staticmethod
    def _cache_layout(k, v):  # (B, T, H, dk) twice -> (2, B, H, T, dk)
        return ops.transpose(ops.stack([k, v]), (0, 1, 3, 2, 4))

    def compute_key_value_cache(self, value):
        """(B, Tk, d) -> (2, B, H, Tk, dk): keys and values of `value`, e.g. the encoder output."""
        return self._cache_layout(self._split_heads(self.key_dense(value)), self._split_heads(self.value_dense(value)))

    def call(self, query, value=None, attention_mask=None, cache=None, cache_update_index=None, training=None):
        value = query if value is None else value
        q = self._split_heads(self.query_dense(query))  # (B, Tq, H, dk)
        kv = "bkhd"  # the layout of k and v: (B, Tk, H, dk), or (B, H, Tk, dk) when they come from a cache
        if cache is not None and cache_update_index is None:  # cross-attention: keys/values fixed
            k, v, kv = cache[0], cache[1], "bhkd"
        else:
            k = self._split_heads(self.key_dense(value))  # (B, Tk, H, dk)
            v = self._split_heads(self.value_dense(value))
            if cache is not None:  # self-attention step: write the new keys/values at i .. i+Tq-1
                new = ops.cast(self._cache_layout(k, v), cache.dtype)
                cache = ops.slice_update(cache, (0, 0, 0, cache_update_index, 0), new)
                k, v, kv = cache[0], cache[1], "bhkd"
        # Scores in float32 so that masking and softmax stay exact under mixed precision.
        scores = ops.einsum(f"bqhd,{kv}->bhqk", ops.cast(q, "float32"), ops.cast(k, "float32"))
        scores = scores / self.head_dim**0.5  # (B, H, Tq, Tk)
        if attention_mask is not None:
            mask = ops.expand_dims(ops.cast(attention_mask, "bool"), axis=1)  # (B, 1, Tq, Tk)
            scores = ops.where(mask, scores, -1e9)
        probs = ops.cast(ops.softmax(scores, axis=-1), self.compute_dtype)
        probs = self.dropout(probs, training=training)
        out = ops.einsum(f"bhqk,{kv}->bqhd", probs, ops.cast(v, self.compute_dtype))
        shape = ops.shape(out)
        out = self.output_dense(ops.reshape(out, (shape[0], shape[1], self.d_model)))
        return out if cache is None else (out, cache)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, attention_dropout=self.attention_dropout,
                      **{f"{k}_initializer": keras.initializers.serialize(v) for k, v in self.initializers.items()})
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class FeedForward(keras.layers.Layer):
    """Position-wise feed-forward network (Table 1, row x4 / x5):

        FFN(x) = act(x W^1 + b^1) W^2 + b^2,   act = ReLU (translation) or GELU (BERT; see `activate`)

    with dropout on the activations ("activation dropout", fairseq's `--activation-dropout`).
    W^1 is d x ffn_dim and W^2 is ffn_dim x d, both from `kernel_initializer`, biases zero.

    Example:

    ```python
    ffn = FeedForward(d_model=16, ffn_dim=64, activation="gelu")
    y = ffn(keras.random.normal((2, 5, 16)))                # (2, 5, 16)
    ```
    """

    def __init__(self, d_model, ffn_dim, activation="relu", activation_dropout=0.0, kernel_initializer=None, **kwargs):
        super().__init__(**kwargs)
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(map(repr, ACTIVATIONS))}, got {activation!r}.")
        self.d_model, self.ffn_dim = d_model, ffn_dim
        self.activation, self.activation_dropout = activation, activation_dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer or xavier())
        common = dict(kernel_initializer=self.kernel_initializer, bias_initializer="zeros", dtype=self.dtype_policy)
        self.w1 = keras.layers.Dense(ffn_dim, name="w1", **common)
        self.w2 = keras.layers.Dense(d_model, name="w2", **common)
        self.dropout = keras.layers.Dropout(activation_dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.w1.build(input_shape)
        self.w2.build(tuple(input_shape[:-1]) + (self.ffn_dim,))

    def call(self, x, training=None):
        h = activate(self.w1(x), self.activation)
        return self.w2(self.dropout(h, training=training))

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, ffn_dim=self.ffn_dim, activation=self.activation,
                      activation_dropout=self.activation_dropout,
                      kernel_initializer=keras.initializers.serialize(self.kernel_initializer))
        return config


class _BlockBase(keras.layers.Layer):
    """Arguments shared by the encoder and decoder blocks (see their docstrings)."""

    def __init__(self, d_model, num_heads, ffn_dim, norm="post", dropout=0.1, attention_dropout=0.0,
                 activation_dropout=0.0, activation="relu", alpha=1.0, beta=1.0,
                 layer_norm_epsilon=LAYER_NORM_EPSILON, initializer="xavier", qkv_gain=1.0, **kwargs):
        super().__init__(**kwargs)
        check_norm(norm)
        if norm != "deepnorm" and (alpha != 1.0 or beta != 1.0):
            raise ValueError(f"alpha and beta only apply to norm='deepnorm' (got norm={norm!r}, "
                             f"alpha={alpha}, beta={beta}).")
        if initializer not in INITIALIZERS:
            raise ValueError(f"initializer must be one of {', '.join(map(repr, INITIALIZERS))}, got {initializer!r}.")
        self.d_model, self.num_heads, self.ffn_dim = d_model, num_heads, ffn_dim
        self.norm, self.alpha, self.beta = norm, float(alpha), float(beta)
        self.dropout, self.attention_dropout, self.activation_dropout = dropout, attention_dropout, activation_dropout
        self.activation, self.layer_norm_epsilon, self.initializer = activation, layer_norm_epsilon, initializer
        self.qkv_gain = float(qkv_gain)

    def _attention(self, name):
        # Gains on top of the initializer, g = qkv_gain (torchscale's DeepNorm init with g = 1/sqrt(2)):
        #   W^Q: g    W^K: g    W^V: g * beta    W^O: beta
        init, g = INITIALIZERS[self.initializer], self.qkv_gain
        return MultiHeadAttention(self.d_model, self.num_heads, attention_dropout=self.attention_dropout,
                                  query_initializer=init(g), key_initializer=init(g),
                                  value_initializer=init(g * self.beta), output_initializer=init(self.beta),
                                  dtype=self.dtype_policy, name=name)

    def _feed_forward(self):
        # DeepNorm: xavier_normal(gain=beta) on W^1 and W^2 (or BERT's std 0.02 times beta).
        return FeedForward(self.d_model, self.ffn_dim, activation=self.activation,
                           activation_dropout=self.activation_dropout,
                           kernel_initializer=INITIALIZERS[self.initializer](self.beta),
                           dtype=self.dtype_policy, name="feed_forward")

    def _residual(self, name):
        return ResidualNorm(self.norm, alpha=self.alpha, dropout=self.dropout, epsilon=self.layer_norm_epsilon,
                            dtype=self.dtype_policy, name=name)

    def get_config(self):
        config = super().get_config()
        config.update(d_model=self.d_model, num_heads=self.num_heads, ffn_dim=self.ffn_dim, norm=self.norm,
                      dropout=self.dropout, attention_dropout=self.attention_dropout,
                      activation_dropout=self.activation_dropout, activation=self.activation,
                      alpha=self.alpha, beta=self.beta, layer_norm_epsilon=self.layer_norm_epsilon,
                      initializer=self.initializer, qkv_gain=self.qkv_gain)
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerEncoderBlock(_BlockBase):
    """One encoder layer: self-attention then FFN, each wrapped by `ResidualNorm`.

        x = ResidualNorm_1(x, SelfAttention(branch_input_1(x)))
        x = ResidualNorm_2(x, FFN(branch_input_2(x)))

    i.e. for norm="post":  x = LN(x + drop(Att(x)));        x = LN(x + drop(FFN(x)))
             norm="pre":   x = x + drop(Att(LN(x)));        x = x + drop(FFN(LN(x)))
             norm="deepnorm": x = LN(alpha x + drop(Att(x))); x = LN(alpha x + drop(FFN(x)))

    Args:
        d_model, num_heads, ffn_dim: widths (fairseq iwslt: 512, 4, 1024; BERT-base: 768, 12, 3072).
        norm: "post", "pre" or "deepnorm".
        dropout: on each branch output; attention_dropout: on attention probabilities; activation_dropout: in the FFN.
        activation: "relu", "gelu" or "gelu_tanh" (`activate`).
        alpha, beta: DeepNorm's residual scale and init gain (`deepnorm_constants`); 1 otherwise.
        layer_norm_epsilon: eps of every LayerNorm (1e-5; BERT 1e-12).
        initializer: kernels from "xavier" (the paper's, `xavier`) or "bert" (`bert_normal`, std 0.02);
            biases zero, LayerNorm gamma one and beta zero either way.
        qkv_gain: a gain g on W^Q, W^K, W^V's initializer (W^V gets g * beta): 1, as the papers' analyses assume,
            or fairseq's and torchscale's 1/sqrt(2) (`TOOLKIT_QKV_GAIN`, `TranslationTransformer`'s default).
    Call: block(x, padding_mask=None) with x (B, T, d) and padding_mask (B, 1, T) from `padding_mask`.

    Example:

    ```python
    token_ids = ops.convert_to_tensor([[5, 8, 3, 0], [7, 2, 0, 0]])   # (B, T), 0 is padding
    mask = ops.expand_dims(ops.not_equal(token_ids, 0), axis=1)       # (B, 1, T), as `padding_mask` makes it
    x = keras.random.normal((2, 4, 16))                               # the embedded tokens (B, T, d)
    for norm in ("post", "pre"):
        block = TransformerEncoderBlock(16, 2, 64, norm=norm)
        y = block(x, padding_mask=mask)                               # (2, 4, 16)

    # DeepNorm for a 6-layer encoder-only stack (`deepnorm_constants(6, 0)`): alpha = (2N)^(1/4), beta = (8N)^(-1/4).
    block = TransformerEncoderBlock(16, 2, 64, norm="deepnorm", alpha=12**0.25, beta=48**-0.25)
    inputs = keras.Input((None, 16))
    model = keras.Model(inputs, block(inputs))
    y = model(x)                                                      # (2, 4, 16)
    ```
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.self_attention = self._attention("self_attention")
        self.self_attention_residual = self._residual("self_attention_residual")
        self.feed_forward = self._feed_forward()
        self.feed_forward_residual = self._residual("feed_forward_residual")

    def build(self, input_shape):
        for layer in (self.self_attention_residual, self.feed_forward_residual, self.feed_forward):
            layer.build(input_shape)
        self.self_attention.build(input_shape)

    def call(self, x, padding_mask=None, training=None):
        h = self.self_attention_residual.branch_input(x)
        x = self.self_attention_residual(x, self.self_attention(h, attention_mask=padding_mask, training=training),
                                         training=training)
        h = self.feed_forward_residual.branch_input(x)
        return self.feed_forward_residual(x, self.feed_forward(h, training=training), training=training)


@keras.saving.register_keras_serializable(package=_PACKAGE)
class TransformerDecoderBlock(_BlockBase):
    """One decoder layer: causal self-attention, cross-attention to the encoder, FFN.

        x = ResidualNorm_1(x, SelfAttention(branch_input_1(x), causal))
        x = ResidualNorm_2(x, CrossAttention(branch_input_2(x), encoder_output))
        x = ResidualNorm_3(x, FFN(branch_input_3(x)))

    DeepNorm scales V and O of both attentions (and W^1, W^2) by beta.

    Call: block(x, encoder_output, decoder_padding_mask=None, encoder_padding_mask=None) with x (B, T, d),
      encoder_output (B, S, d) and masks (B, 1, T) and (B, 1, S); the causal mask is applied here.
    Incremental decoding: also pass `self_attention_cache` (2, B, H, L, dk), `cache_update_index`
      (the position of x's first token) and `cross_attention_cache` (from
      `cross_attention.compute_key_value_cache(encoder_output)`); returns (x, self_attention_cache).

    Example:

    ```python
    decoder = TransformerDecoderBlock(16, 2, 64, norm="pre")
    x = keras.random.normal((2, 5, 16))                     # target side (B, T, d)
    memory = keras.random.normal((2, 7, 16))                # encoder output (B, S, d)
    y = decoder(x, memory)                                  # causal self-attention, (2, 5, 16)

    # The same, one position at a time, with key/value caches of shape (2, B, H, L, dk):
    cache = ops.zeros((2, 2, 2, 5, 8))
    cross = decoder.cross_attention.compute_key_value_cache(memory)
    for i in range(5):
        step, cache = decoder(x[:, i:i + 1], self_attention_cache=cache, cache_update_index=i,
                              cross_attention_cache=cross)  # (2, 1, 16), equal to y[:, i:i + 1]
    ```
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.self_attention = self._attention("self_attention")
        self.self_attention_residual = self._residual("self_attention_residual")
        self.cross_attention = self._attention("cross_attention")
        self.cross_attention_residual = self._residual("cross_attention_residual")
        self.feed_forward = self._feed_forward()
        self.feed_forward_residual = self._residual("feed_forward_residual")

    def build(self, x_shape, encoder_output_shape=None):
        encoder_output_shape = x_shape if encoder_output_shape is None else encoder_output_shape
        for layer in (self.self_attention_residual, self.cross_attention_residual,
                      self.feed_forward_residual, self.feed_forward):
            layer.build(x_shape)
        self.self_attention.build(x_shape)
        self.cross_attention.build(x_shape, encoder_output_shape)

    def call(self, x, encoder_output=None, decoder_padding_mask=None, encoder_padding_mask=None,
             self_attention_cache=None, cache_update_index=None, cross_attention_cache=None, training=None):
        length = ops.shape(x)[1]
        if self_attention_cache is None:
            mask = _combine_masks(causal_mask(length), decoder_padding_mask)
        else:  # positions written so far: j < cache_update_index + length, causal among the new ones
            cache_length = ops.shape(self_attention_cache)[3]
            q = ops.arange(length)[:, None] + cache_update_index
            mask = ops.expand_dims(ops.greater_equal(q, ops.arange(cache_length)[None, :]), axis=0)
            mask = _combine_masks(mask, decoder_padding_mask)

        h = self.self_attention_residual.branch_input(x)
        attended = self.self_attention(h, attention_mask=mask, cache=self_attention_cache,
                                       cache_update_index=cache_update_index, training=training)
        if self_attention_cache is not None:
            attended, self_attention_cache = attended
        x = self.self_attention_residual(x, attended, training=training)

        h = self.cross_attention_residual.branch_input(x)
        if cross_attention_cache is not None:
            attended, _ = self.cross_attention(h, attention_mask=encoder_padding_mask,
                                               cache=cross_attention_cache, training=training)
        else:
            attended = self.cross_attention(h, encoder_output, attention_mask=encoder_padding_mask, training=training)
        x = self.cross_attention_residual(x, attended, training=training)

        h = self.feed_forward_residual.branch_input(x)
        x = self.feed_forward_residual(x, self.feed_forward(h, training=training), training=training)
        return x if self_attention_cache is None else (x, self_attention_cache)


def sinusoidal_positions(positions, d_model):
    """fairseq's sinusoidal position embedding, [sin | cos] concatenated (not interleaved):

        PE(p, i)          = sin(p * w_i),   PE(p, d/2 + i) = cos(p * w_i),
        w_i = exp(-i * ln(10000) / (d/2 - 1)),  i = 0 .. d/2 - 1.

    positions: integer tensor of any shape -> float32 tensor of shape positions.shape + (d,).
    """
    half = d_model // 2
    freqs = ops.exp(ops.arange(half, dtype="float32") * (-math.log(10000.0) / max(half - 1, 1)))
    angles = ops.expand_dims(ops.cast(positions, "float32"), -1) * freqs
    pe = ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)
    if d_model % 2:
        pe = ops.pad(pe, [(0, 0)] * (len(pe.shape) - 1) + [(0, 1)])
    return pe


@keras.saving.register_keras_serializable(package=_PACKAGE)
class ScaledTokenEmbedding(keras.layers.Layer):
    """Translation input embedding (fairseq): E[token] * sqrt(d) + PE(position), PE sinusoidal.

    E is (vocab, d) with entries N(0, d^-1/2)^2 (fairseq), so E * sqrt(d) has unit variance.
    `project(h)` gives the tied output logits h E^T (Press & Wolf 2017; the paper's x_final W_emb^T).
    Call: emb(token_ids, start_position=0) with token_ids (B, T) -> (B, T, d), at positions
    start_position, start_position + 1, ...; or emb(token_ids, positions=p) with p (B, T) each token's
    position in its own sentence (packed rows: 0, 1, 2, 0, 1, ...).

    Example:

    ```python
    embedding = ScaledTokenEmbedding(vocab_size=100, d_model=16)
    token_ids = ops.convert_to_tensor([[5, 8, 3, 0], [7, 2, 0, 0]])
    x = embedding(token_ids)                                # E[token] * sqrt(16) + PE, (2, 4, 16)
    logits = embedding.project(x)                           # tied output layer, (2, 4, 100)
    ```
    """

    def __init__(self, vocab_size, d_model, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model = vocab_size, d_model

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(shape=(self.vocab_size, self.d_model), name="embeddings",
                                          initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5))

    def call(self, token_ids, start_position=0, positions=None):
        x = ops.take(self.embeddings, ops.cast(token_ids, "int32"), axis=0) * self.d_model**0.5
        if positions is None:
            positions = (ops.arange(ops.shape(token_ids)[1]) + start_position)[None]
        return ops.cast(x, self.compute_dtype) + ops.cast(sinusoidal_positions(positions, self.d_model),
                                                          self.compute_dtype)

    def project(self, h):
        """(B, T, d) -> (B, T, vocab) logits with the shared embedding matrix."""
        return ops.matmul(h, ops.cast(ops.transpose(self.embeddings), h.dtype))

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, d_model=self.d_model)
        return config


@keras.saving.register_keras_serializable(package=_PACKAGE)
class BertEmbedding(keras.layers.Layer):
    """BERT input embedding: LN(E_token[w] + E_position[p] + E_segment[s]) then dropout.

    All three tables are learned, initialised from a truncated normal with std 0.02 (`bert_normal`); the
    LayerNorm's eps is BERT's 1e-12 (Devlin et al. 2019; google-research/bert modeling.py).
    `project(h)` gives the tied masked-LM logits h E_token^T.
    Call: emb(token_ids, segment_ids=None) with both (B, T), T <= max_positions -> (B, T, d).

    Example:

    ```python
    embedding = BertEmbedding(vocab_size=100, d_model=16, max_positions=32)
    token_ids = ops.convert_to_tensor([[5, 8, 3, 0], [7, 2, 0, 0]])
    segment_ids = ops.convert_to_tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    x = embedding(token_ids, segment_ids)                   # (2, 4, 16)
    logits = embedding.project(x)                           # tied masked-LM output, (2, 4, 100)
    ```
    """

    def __init__(self, vocab_size, d_model, max_positions=512, num_segments=2, dropout=0.1,
                 layer_norm_epsilon=BERT_LAYER_NORM_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model = vocab_size, d_model
        self.max_positions, self.num_segments = max_positions, num_segments
        self.rate, self.layer_norm_epsilon = dropout, layer_norm_epsilon
        self.layer_norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=self.dtype_policy,
                                                          name="layer_norm")
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape=None):
        init = bert_normal()
        self.token_embeddings = self.add_weight(shape=(self.vocab_size, self.d_model), initializer=init,
                                                name="token_embeddings")
        self.position_embeddings = self.add_weight(shape=(self.max_positions, self.d_model), initializer=init,
                                                   name="position_embeddings")
        self.segment_embeddings = self.add_weight(shape=(self.num_segments, self.d_model), initializer=init,
                                                  name="segment_embeddings")
        self.layer_norm.build((None, None, self.d_model))

    def call(self, token_ids, segment_ids=None, training=None):
        length = ops.shape(token_ids)[1]
        x = ops.take(self.token_embeddings, ops.cast(token_ids, "int32"), axis=0)
        x = x + self.position_embeddings[None, :length]
        if segment_ids is not None:
            x = x + ops.take(self.segment_embeddings, ops.cast(segment_ids, "int32"), axis=0)
        else:
            x = x + self.segment_embeddings[0]
        return self.dropout(self.layer_norm(ops.cast(x, self.compute_dtype)), training=training)

    def project(self, h):
        return ops.matmul(h, ops.cast(ops.transpose(self.token_embeddings), h.dtype))

    def get_config(self):
        config = super().get_config()
        config.update(vocab_size=self.vocab_size, d_model=self.d_model, max_positions=self.max_positions,
                      num_segments=self.num_segments, dropout=self.rate,
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return config
