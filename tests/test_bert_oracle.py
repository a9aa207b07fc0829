"""Oracle: BertMaskedLM(norm="post") with its default (Devlin et al. 2019) settings is keras-hub's BertBackbone.

Both are built at one tiny size, ours gets random weights (zero biases and unit LayerNorm scales would
hide mix-ups), every weight is copied into keras-hub's model, and the sequence outputs (the encoder
output, before the masked-LM head) must agree to 1e-5 on the current backend. BertBackbone is Devlin's
BERT: GELU in its tanh approximation, LayerNorm eps 1e-12, truncated normal init with std 0.02. The
same comparison with the exact GELU or eps 1e-5 must fail, which shows the test can tell them apart.
"""

import numpy as np
import pytest
from conftest import Copier, hub_attr, tiny_bert, to_numpy

keras_hub = pytest.importorskip("keras_hub")

VOCAB, LAYERS, D, H, FFN, POSITIONS, B, T = 41, 2, 16, 2, 32, 24, 3, 11


def randomize(model, rng):
    """Random values for every weight: LayerNorm gammas around 1, embeddings at BERT's scale (std 0.02,
    so that the embedding LayerNorm's eps matters), everything else N(0, 0.3^2), biases included."""
    for v in model.weights:
        if v.path.endswith("gamma"):
            value = 1.0 + rng.normal(scale=0.3, size=v.shape)
        elif "embedding" in v.path and "layer_norm" not in v.path:
            value = rng.normal(scale=0.02, size=v.shape)
        else:
            value = rng.normal(scale=0.3, size=v.shape)
        v.assign(value.astype("float32"))


def copy_weights(ours, hub):
    """Our BertMaskedLM's encoder weights -> keras-hub's BertBackbone (all of its weights but the pooler)."""
    copier = Copier()
    embedding = ours.embedding
    copier.assign(hub_attr(hub_attr(hub, "token_embedding"), "embeddings"), embedding.token_embeddings)
    copier.assign(hub_attr(hub_attr(hub, "position_embedding"), "position_embeddings"), embedding.position_embeddings)
    copier.assign(hub_attr(hub_attr(hub, "segment_embedding"), "embeddings"), embedding.segment_embeddings)
    copier.layer_norm(embedding.layer_norm, hub_attr(hub, "embeddings_layer_norm"))
    for block, layer in zip(ours.encoder_blocks, hub_attr(hub, "transformer_layers"), strict=True):
        attention = hub_attr(layer, "_self_attention_layer")
        # Ours: Dense (d, d) kernels. keras.layers.MultiHeadAttention: EinsumDense kernels (d, H, dk) for
        # query/key/value and (H, dk, d) for the output; heads are contiguous dk-slices in both.
        for name in ("query", "key", "value", "output"):
            copier.dense(getattr(block.self_attention, f"{name}_dense"), hub_attr(attention, f"_{name}_dense"))
        copier.layer_norm(block.self_attention_residual.layer_norm, hub_attr(layer, "_self_attention_layer_norm"))
        copier.dense(block.feed_forward.w1, hub_attr(layer, "_feedforward_intermediate_dense"))
        copier.dense(block.feed_forward.w2, hub_attr(layer, "_feedforward_output_dense"))
        copier.layer_norm(block.feed_forward_residual.layer_norm, hub_attr(layer, "_feedforward_layer_norm"))
    pooler = {id(v) for v in hub_attr(hub, "pooled_dense").weights}
    missed = [v.path for v in hub.weights if id(v) not in copier.assigned | pooler]
    assert not missed, f"keras-hub weights with no counterpart in our model: {missed}"
    return copier


def inputs(rng):
    """Token ids with [PAD] (0) at the end of two rows, two segments, and keras-hub's padding mask."""
    token_ids = rng.integers(1, VOCAB, (B, T)).astype("int32")
    token_ids[1, -3:] = 0
    token_ids[2, -5:] = 0
    segment_ids = (np.arange(T)[None, :] >= np.array([[4], [6], [2]])).astype("int32")
    return token_ids, segment_ids, (token_ids != 0).astype("int32")


def compare(rng, **ours_overrides):
    """(our sequence output, keras-hub's, keras-hub's before the copy) at padded positions excluded."""
    ours = tiny_bert("post", vocab_size=VOCAB, num_layers=LAYERS, d_model=D, num_heads=H, ffn_dim=FFN,
                     max_positions=POSITIONS, **ours_overrides)
    hub = keras_hub.models.BertBackbone(vocabulary_size=VOCAB, num_layers=LAYERS, num_heads=H, hidden_dim=D,
                                        intermediate_dim=FFN, dropout=0.0, max_sequence_length=POSITIONS)
    token_ids, segment_ids, padding_mask = inputs(rng)
    ours.build()
    randomize(ours, rng)
    feed = {"token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": padding_mask}
    before = to_numpy(hub(feed)["sequence_output"])
    copy_weights(ours, hub)
    expected = to_numpy(hub(feed)["sequence_output"])
    actual = to_numpy(ours.encode(token_ids, segment_ids))
    real = padding_mask.astype(bool)  # outputs at [PAD] positions are nobody's concern
    return actual[real], expected[real], before[real]


def test_post_ln_bert_equals_keras_hub_bert_backbone():
    """Devlin's BERT two ways: our defaults against keras-hub's BertBackbone, same weights, to 1e-5."""
    actual, expected, before = compare(np.random.default_rng(0))
    assert np.abs(before - expected).max() > 0.1  # the copy is what makes them agree
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("override", [dict(activation="gelu"), dict(layer_norm_epsilon=1e-5)],
                         ids=["exact-gelu", "eps-1e-5"])
def test_the_oracle_tells_other_settings_apart(override):
    """The exact GELU, or fairseq's eps 1e-5, is not Devlin's BERT: the same comparison fails."""
    actual, expected, _ = compare(np.random.default_rng(0), **override)
    assert np.abs(actual - expected).max() > 1e-4
