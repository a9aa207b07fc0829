"""layers.py: the three placements, attention masks and cache, initialisation, DeepNorm constants."""

import math

import keras
import numpy as np
import pytest
from conftest import NORMS, to_numpy

import layers
from harness import specs
from layers import (
    BertEmbedding,
    FeedForward,
    MultiHeadAttention,
    ResidualNorm,
    ScaledTokenEmbedding,
    TransformerDecoderBlock,
    TransformerEncoderBlock,
    activate,
    causal_mask,
    deepnorm_constants,
    padding_mask,
    sinusoidal_positions,
)

D, H, FFN = 16, 2, 32


def encoder_block(norm, **kw):
    kw.setdefault("dropout", 0.0)
    return TransformerEncoderBlock(D, H, FFN, norm=norm, **kw)


def decoder_block(norm, **kw):
    kw.setdefault("dropout", 0.0)
    return TransformerDecoderBlock(D, H, FFN, norm=norm, **kw)


def random_x(batch=2, length=5, d=D):
    return np.random.normal(size=(batch, length, d)).astype("float32")


def test_layers_norms_equal_the_command_lines_copy():
    """layers.py defines NORMS itself, so a pasted class needs no project import; harness/specs.py keeps
    the Keras-free copy the scripts' --norm reads before a backend is loaded. The two must stay equal."""
    assert layers.NORMS == specs.NORMS


# --- configs -----------------------------------------------------------------------------------

LAYER_FACTORIES = {
    "attention": lambda norm: MultiHeadAttention(D, H, attention_dropout=0.1, value_initializer=keras.initializers.Zeros()),
    "ffn": lambda norm: FeedForward(D, FFN, activation="gelu", activation_dropout=0.2),
    "ffn_gelu_tanh": lambda norm: FeedForward(D, FFN, activation="gelu_tanh"),
    "residual": lambda norm: ResidualNorm(norm, alpha=1.5 if norm == "deepnorm" else 1.0, dropout=0.1),
    "encoder": lambda norm: encoder_block(norm, **({"alpha": 2.0, "beta": 0.5} if norm == "deepnorm" else {})),
    "decoder": lambda norm: decoder_block(norm, attention_dropout=0.1, activation_dropout=0.1),
    "encoder_bert": lambda norm: encoder_block(norm, activation="gelu_tanh", initializer="bert",
                                               layer_norm_epsilon=1e-12),
    "token_embedding": lambda norm: ScaledTokenEmbedding(30, D),
    "bert_embedding": lambda norm: BertEmbedding(30, D, max_positions=20, num_segments=3, dropout=0.2),
}


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind", sorted(LAYER_FACTORIES))
def test_config_round_trip(kind, norm):
    layer = LAYER_FACTORIES[kind](norm)
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    # The serialized form names the registered class, so load_model can find it.
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer) and restored.get_config() == config


# --- the three placements ---------------------------------------------------------------------

def copy_weights(source, target):
    target.set_weights(source.get_weights())


@pytest.mark.parametrize("block_fn", [encoder_block, decoder_block], ids=["encoder", "decoder"])
def test_post_ln_is_deepnorm_with_alpha_beta_one(block_fn):
    x, memory = random_x(), random_x(length=4)
    args = (x,) if block_fn is encoder_block else (x, memory)
    post, deep = block_fn("post"), block_fn("deepnorm", alpha=1.0, beta=1.0)
    post(*args), deep(*args)
    copy_weights(post, deep)
    np.testing.assert_allclose(to_numpy(post(*args)), to_numpy(deep(*args)), atol=1e-6)
    # ... and a real alpha changes the output.
    deep2 = block_fn("deepnorm", alpha=2.0, beta=1.0)
    deep2(*args)
    copy_weights(post, deep2)
    assert np.abs(to_numpy(post(*args)) - to_numpy(deep2(*args))).max() > 1e-3


def test_pre_ln_and_post_ln_differ_with_the_same_weights():
    x = random_x()
    post, pre = encoder_block("post"), encoder_block("pre")
    post(x), pre(x)
    copy_weights(post, pre)
    assert np.abs(to_numpy(post(x)) - to_numpy(pre(x))).max() > 1e-2


def test_residual_norm_formulas():
    """ResidualNorm computes exactly the three formulas of its docstring (LN gamma=1, beta=0 at init)."""
    x, fx = random_x(), random_x()

    def ln(v, eps=1e-5):
        return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + eps)

    expected = {"post": ln(x + fx), "pre": x + fx, "deepnorm": ln(1.7 * x + fx)}
    for norm, want in expected.items():
        layer = ResidualNorm(norm, alpha=1.7 if norm == "deepnorm" else 1.0)
        np.testing.assert_allclose(to_numpy(layer(x, fx)), want, atol=1e-5)
        want_input = ln(x) if norm == "pre" else x
        np.testing.assert_allclose(to_numpy(layer.branch_input(x)), want_input, atol=1e-5)


@pytest.mark.parametrize("norm", ["post", "deepnorm"])
@pytest.mark.parametrize("block_fn", [encoder_block, decoder_block], ids=["encoder", "decoder"])
def test_block_output_is_normalised_at_init(block_fn, norm):
    x = random_x(length=6) * 3.0 + 1.0
    args = (x,) if block_fn is encoder_block else (x, random_x(length=4))
    kw = {"alpha": 1.8, "beta": 0.4} if norm == "deepnorm" else {}
    y = to_numpy(block_fn(norm, **kw)(*args))
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(y.std(-1), 1.0, atol=1e-3)


def test_pre_ln_block_output_is_not_normalised():
    x = random_x() * 3.0
    y = to_numpy(encoder_block("pre")(x))
    assert np.abs(y.std(-1) - 1.0).max() > 0.5


# --- masks -------------------------------------------------------------------------------------

@pytest.mark.parametrize("norm", NORMS)
def test_padding_never_changes_other_positions(norm):
    block = encoder_block(norm)
    x = random_x(length=6)
    mask = np.ones((2, 1, 6), bool)
    mask[:, :, 4:] = False
    y1 = to_numpy(block(x, padding_mask=mask))
    x2 = x.copy()
    x2[:, 4:] = np.random.normal(size=x2[:, 4:].shape) * 10
    y2 = to_numpy(block(x2, padding_mask=mask))
    np.testing.assert_allclose(y1[:, :4], y2[:, :4], atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_decoder_block_never_sees_the_future(norm):
    block = decoder_block(norm)
    x, memory = random_x(length=6), random_x(length=3)
    y1 = to_numpy(block(x, memory))
    x2 = x.copy()
    x2[:, 3:] += 5.0
    y2 = to_numpy(block(x2, memory))
    np.testing.assert_allclose(y1[:, :3], y2[:, :3], atol=1e-5)
    assert np.abs(y1[:, 3:] - y2[:, 3:]).max() > 1e-3


def test_mask_helpers():
    np.testing.assert_array_equal(to_numpy(padding_mask(np.array([[5, 3, 0]]), 0)), [[[True, True, False]]])
    np.testing.assert_array_equal(to_numpy(causal_mask(3))[0], np.tril(np.ones((3, 3), bool)))
    # Two new queries at the end of four keys: query 0 sees keys 0..2, query 1 sees all.
    np.testing.assert_array_equal(to_numpy(causal_mask(2, 4))[0], [[1, 1, 1, 0], [1, 1, 1, 1]])


def test_attention_matches_a_numpy_reference():
    layer = MultiHeadAttention(D, H)
    x, y = random_x(length=3), random_x(length=4)
    mask = np.array([[[1, 1, 0, 1]], [[1, 1, 1, 1]]], bool)
    out = to_numpy(layer(x, y, attention_mask=mask))
    wq, bq, wk, bk, wv, bv, wo, bo = [to_numpy(w) for w in layer.weights]
    q = (x @ wq + bq).reshape(2, 3, H, D // H)
    k = (y @ wk + bk).reshape(2, 4, H, D // H)
    v = (y @ wv + bv).reshape(2, 4, H, D // H)
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D // H)
    scores = np.where(mask[:, None], scores, -1e9)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.einsum("bhqk,bkhd->bqhd", p, v).reshape(2, 3, D) @ wo + bo
    np.testing.assert_allclose(out, want, atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_decoder_block_cache_equals_full_pass(norm):
    block = decoder_block(norm)
    x, memory = random_x(length=5), random_x(length=3)
    full = to_numpy(block(x, memory))
    cache = np.zeros((2, 2, H, 7, D // H), "float32")  # (keys/values, B, H, L, dk): 7 positions, 5 used
    cross = block.cross_attention.compute_key_value_cache(memory)
    steps = []
    for i in range(5):
        y, cache = block(x[:, i:i + 1], self_attention_cache=cache, cache_update_index=i, cross_attention_cache=cross)
        steps.append(to_numpy(y))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


# --- initialisation ---------------------------------------------------------------------------

@pytest.mark.parametrize("qkv_gain", [1.0, 2 ** -0.5], ids=["theory", "toolkit"])
def test_kernel_statistics_follow_xavier_and_deepnorm_beta(qkv_gain):
    """Var W^Q = Var W^K = g^2 / d, Var W^V = (g beta)^2 / d, Var W^O = beta^2 / d, Var W^1 = Var W^2 =
    2 beta^2 / (d + ffn), with g = qkv_gain: 1 (the theory's) or 1/sqrt(2) (fairseq's and torchscale's)."""
    d, ffn, beta = 128, 256, 0.35
    block = TransformerDecoderBlock(d, 4, ffn, norm="deepnorm", alpha=2.0, beta=beta, qkv_gain=qkv_gain)
    block(np.zeros((1, 2, d), "float32"), np.zeros((1, 2, d), "float32"))
    assert block.get_config()["qkv_gain"] == qkv_gain
    xavier_std = {(d, d): math.sqrt(2 / (2 * d)), (d, ffn): math.sqrt(2 / (d + ffn)), (ffn, d): math.sqrt(2 / (d + ffn))}
    checked = 0
    for attention in (block.self_attention, block.cross_attention):
        for dense, gain in ((attention.query_dense, qkv_gain), (attention.key_dense, qkv_gain),
                            (attention.value_dense, qkv_gain * beta), (attention.output_dense, beta)):
            kernel = to_numpy(dense.kernel)
            assert abs(kernel.std() / (gain * xavier_std[kernel.shape]) - 1) < 0.05, dense.name
            assert abs(kernel.mean()) < 0.05 * xavier_std[kernel.shape]
            np.testing.assert_array_equal(to_numpy(dense.bias), 0.0)
            checked += 1
    for dense in (block.feed_forward.w1, block.feed_forward.w2):
        kernel = to_numpy(dense.kernel)
        assert abs(kernel.std() / (beta * xavier_std[kernel.shape]) - 1) < 0.05, dense.name
        np.testing.assert_array_equal(to_numpy(dense.bias), 0.0)
        checked += 1
    assert checked == 10


def test_bert_initializer_is_a_normal_with_std_0_02_truncated_at_two_std():
    """initializer="bert" (google-research/bert create_initializer): every kernel N(0, 0.02^2) cut at +-0.04,
    DeepNorm's beta scaling V, O, W^1, W^2; biases zero. A normal cut at +-2 std keeps 0.880 of its std."""
    d, ffn, beta = 128, 256, 0.35
    block = TransformerEncoderBlock(d, 4, ffn, norm="deepnorm", alpha=2.0, beta=beta, initializer="bert")
    block(np.zeros((1, 2, d), "float32"))
    phi2 = math.exp(-2) / math.sqrt(2 * math.pi)  # standard normal density at 2
    truncated = math.sqrt(1 - 4 * phi2 / math.erf(math.sqrt(2)))  # std of N(0, 1) cut to [-2, 2]
    attention = block.self_attention
    for dense, gain in ((attention.query_dense, 1.0), (attention.key_dense, 1.0), (attention.value_dense, beta),
                        (attention.output_dense, beta), (block.feed_forward.w1, beta), (block.feed_forward.w2, beta)):
        kernel = to_numpy(dense.kernel)
        assert abs(kernel.std() / (0.02 * gain * truncated) - 1) < 0.05, dense.name
        assert np.abs(kernel).max() <= 2 * 0.02 * gain * (1 + 1e-6), dense.name
        np.testing.assert_array_equal(to_numpy(dense.bias), 0.0)


def test_activations():
    """relu; gelu = x Phi(x); gelu_tanh = BERT's 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
    x = np.linspace(-5, 5, 201).astype("float32")
    exact = x * 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    tanh = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    np.testing.assert_allclose(to_numpy(activate(x, "relu")), np.maximum(x, 0))
    np.testing.assert_allclose(to_numpy(activate(x, "gelu")), exact, atol=1e-6)
    np.testing.assert_allclose(to_numpy(activate(x, "gelu_tanh")), tanh, atol=1e-6)
    assert np.abs(exact - tanh).max() > 1e-4  # the two GELUs are different functions


def test_deepnorm_constants_match_the_paper():
    c = deepnorm_constants(6, 6)
    np.testing.assert_allclose(c["encoder"], (1.418, 0.497), atol=5e-4)
    np.testing.assert_allclose(c["decoder"], (2.060, 0.343), atol=5e-4)
    c = deepnorm_constants(6, 0)
    np.testing.assert_allclose(c["encoder"], (1.861, 0.380), atol=5e-4)
    assert c["decoder"] is None
    c = deepnorm_constants(0, 12)
    np.testing.assert_allclose(c["decoder"], (24**0.25, 96**-0.25))
    # The authors' torchscale code: the encoder-decoder's encoder beta is 1.15 (N^4 M)^(-1/16), not 0.87.
    paper, code = deepnorm_constants(6, 6), deepnorm_constants(6, 6, "torchscale")
    np.testing.assert_allclose(code["encoder"], (paper["encoder"][0], 1.15 * (6**5) ** (-1 / 16)))
    assert code["decoder"] == paper["decoder"] and deepnorm_constants(6, 0, "torchscale") == deepnorm_constants(6, 0)
    # Seed 002's per-optimizer rules, 2N = 12 sub-layers.
    np.testing.assert_allclose(deepnorm_constants(6, 0, "sgd")["encoder"], (12**0.25, 12**-0.25))
    np.testing.assert_allclose(deepnorm_constants(6, 0, "adam")["encoder"], (12**0.5, 12**-0.5))
    np.testing.assert_allclose(deepnorm_constants(0, 6, "lamb")["decoder"], (1.0, 12**-0.5))
    # Lemma 4.2's requirement for an encoder-only stack: 2N (v^2 + w^2) / alpha^2 = 1 with v = w = beta.
    alpha, beta = deepnorm_constants(18, 0)["encoder"]
    assert abs(2 * 18 * 2 * beta**2 / alpha**2 - 1) < 1e-12


# --- embeddings -------------------------------------------------------------------------------

def test_sinusoidal_positions_fairseq_layout():
    pe = to_numpy(sinusoidal_positions(np.arange(5), 8))
    freqs = np.exp(-np.arange(4) * math.log(10000) / 3)
    np.testing.assert_allclose(pe[:, :4], np.sin(np.arange(5)[:, None] * freqs), atol=1e-6)
    np.testing.assert_allclose(pe[:, 4:], np.cos(np.arange(5)[:, None] * freqs), atol=1e-6)


def test_scaled_token_embedding():
    emb = ScaledTokenEmbedding(30, D)
    ids = np.array([[3, 4, 5]])
    out = to_numpy(emb(ids, start_position=2))
    table = to_numpy(emb.embeddings)
    np.testing.assert_allclose(out, table[ids] * math.sqrt(D) + to_numpy(sinusoidal_positions(np.arange(2, 5), D)),
                               atol=1e-5)
    np.testing.assert_allclose(to_numpy(emb.project(out)), out @ table.T, rtol=1e-5, atol=1e-5)
    assert abs(table.std() * math.sqrt(D) - 1) < 0.1


def test_bert_embedding_segments_and_positions():
    emb = BertEmbedding(30, D, max_positions=10, dropout=0.0)
    ids = np.array([[1, 2, 3, 4]])
    a = to_numpy(emb(ids, np.array([[0, 0, 1, 1]])))
    b = to_numpy(emb(ids, np.array([[0, 0, 0, 0]])))
    np.testing.assert_allclose(a[:, :2], b[:, :2], atol=1e-6)
    assert np.abs(a[:, 2:] - b[:, 2:]).max() > 1e-4
    np.testing.assert_allclose(a.mean(-1), 0.0, atol=1e-5)  # embedding LayerNorm


# --- bad arguments ----------------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: encoder_block("middle"), "norm must be one of 'post', 'pre', 'deepnorm'"),
    (lambda: ResidualNorm("sandwich"), "norm must be one of"),
    (lambda: encoder_block("post", alpha=2.0), "only apply to norm='deepnorm'"),
    (lambda: encoder_block("pre", beta=0.5), "only apply to norm='deepnorm'"),
    (lambda: ResidualNorm("pre", alpha=2.0), "only applies to norm='deepnorm'"),
    (lambda: MultiHeadAttention(10, 3), "must be divisible by num_heads"),
    (lambda: FeedForward(8, 16, activation="tanh"), "activation must be one of 'relu', 'gelu', 'gelu_tanh'"),
    (lambda: encoder_block("post", initializer="he"), "initializer must be one of 'xavier', 'bert'"),
    (lambda: deepnorm_constants(6, 6, rule="rmsprop"), "rule must be one of"),
    (lambda: deepnorm_constants(6, 6, rule="adam"), "use rule='paper' for an encoder-decoder"),
    (lambda: deepnorm_constants(0, 0), "at least one encoder or decoder layer"),
    (lambda: deepnorm_constants(-1, 6), "encoder_layers must be a non-negative integer"),
])
def test_bad_arguments_raise_clear_value_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()
