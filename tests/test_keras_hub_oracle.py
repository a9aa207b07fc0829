"""Oracle: our Post-LN / Pre-LN encoder and decoder blocks match keras-hub's TransformerEncoder /
TransformerDecoder (normalize_first=False / True) when keras-hub's blocks get our weights."""

import keras
import numpy as np
import pytest
from conftest import Copier, hub_attr

from layers import TransformerDecoderBlock, TransformerEncoderBlock

keras_hub = pytest.importorskip("keras_hub")

B, T_ENC, T_DEC, D, H, FFN = 2, 5, 4, 16, 4, 32


def randomize(block, rng):
    """Give every weight of our block a random value (zero biases and unit LN scales would hide mix-ups)."""
    for v in block.weights:
        value = rng.normal(scale=0.3, size=v.shape) + (1.0 if v.path.endswith("gamma") else 0.0)
        v.assign(value.astype("float32"))


class BlockCopier(Copier):
    """`Copier` with keras-hub's attention layout."""

    def attention(self, ours, theirs):
        # Ours: Dense (d, d) kernels. keras.layers.MultiHeadAttention: EinsumDense kernels (d, H, dk) for
        # query/key/value and (H, dk, d) for the output; heads are contiguous dk-slices in both.
        for name in ("query", "key", "value", "output"):
            self.dense(getattr(ours, f"{name}_dense"), hub_attr(theirs, f"_{name}_dense"))

    def feed_forward(self, ours, hub):
        self.dense(ours.w1, hub_attr(hub, "_feedforward_intermediate_dense"))
        self.dense(ours.w2, hub_attr(hub, "_feedforward_output_dense"))


def copy_weights(ours, hub, kind):
    copier = BlockCopier()
    copier.attention(ours.self_attention, hub_attr(hub, "_self_attention_layer"))
    copier.layer_norm(ours.self_attention_residual.layer_norm, hub_attr(hub, "_self_attention_layer_norm"))
    if kind == "decoder":
        copier.attention(ours.cross_attention, hub_attr(hub, "_cross_attention_layer"))
        copier.layer_norm(ours.cross_attention_residual.layer_norm, hub_attr(hub, "_cross_attention_layer_norm"))
    copier.feed_forward(ours.feed_forward, hub)
    copier.layer_norm(ours.feed_forward_residual.layer_norm, hub_attr(hub, "_feedforward_layer_norm"))
    missed = [v.path for v in hub.weights if id(v) not in copier.assigned]
    assert not missed, f"keras-hub weights with no counterpart in our block: {missed}"
    assert len(copier.assigned) == len(ours.weights) == len(hub.weights)


@pytest.mark.parametrize("norm", ("post", "pre"))
@pytest.mark.parametrize("kind", ("encoder", "decoder"))
def test_block_matches_keras_hub(kind, norm):
    """Same weights, same inputs -> the same outputs as keras-hub (no final LN in either Pre-LN block)."""
    rng = np.random.default_rng(0)
    common = dict(dropout=0.0, activation="relu", layer_norm_epsilon=1e-5, normalize_first=(norm == "pre"))
    ours_kw = dict(norm=norm, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, activation="relu",
                   layer_norm_epsilon=1e-5)
    encoder_x = rng.normal(size=(B, T_ENC, D)).astype("float32")
    if kind == "encoder":
        ours = TransformerEncoderBlock(D, H, FFN, **ours_kw)
        hub = keras_hub.layers.TransformerEncoder(intermediate_dim=FFN, num_heads=H, **common)
        args = (encoder_x,)
    else:
        ours = TransformerDecoderBlock(D, H, FFN, **ours_kw)
        hub = keras_hub.layers.TransformerDecoder(intermediate_dim=FFN, num_heads=H, **common)
        args = (rng.normal(size=(B, T_DEC, D)).astype("float32"), encoder_x)
    ours(*args)  # build both on the same shapes; our decoder applies causal_mask itself
    hub(*args)
    randomize(ours, rng)
    copy_weights(ours, hub, kind)

    expected = keras.ops.convert_to_numpy(hub(*args))  # decoder: use_causal_mask=True (the default)
    actual = keras.ops.convert_to_numpy(ours(*args))
    assert actual.shape == expected.shape == args[0].shape
    np.testing.assert_allclose(actual, expected, atol=1e-5, rtol=1e-5)
