"""layers.LayerNorm, the written-out LayerNorm: equal to keras.layers.LayerNormalization to float32 round-off,
alone and in a whole Pre-LN translation model (logits and every gradient, on jax)."""

import keras
import numpy as np
import pytest
from conftest import to_numpy

import layers
import models
from layers import LayerNorm
from models import LabelSmoothedCrossEntropy, TranslationTransformer


class KerasLayerNorm(keras.layers.LayerNormalization):
    """Keras's own layer, standing in for LayerNorm (the model before the change)."""

    def __init__(self, epsilon=layers.LAYER_NORM_EPSILON, **kwargs):
        super().__init__(epsilon=epsilon, **kwargs)


def test_layer_norm_equals_keras_layer_normalization():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(3, 7, 16)) * 4.0 + 2.0).astype("float32")
    ours, theirs = LayerNorm(epsilon=1e-5), keras.layers.LayerNormalization(epsilon=1e-5)
    for layer in (ours, theirs):
        layer.build(x.shape)
    ours.set_weights([rng.normal(size=16).astype("float32") + 1.0, rng.normal(size=16).astype("float32")])
    theirs.set_weights(ours.get_weights())
    assert [w.path.split("/")[-1] for w in ours.weights] == [w.path.split("/")[-1] for w in theirs.weights]
    np.testing.assert_allclose(to_numpy(ours(x)), to_numpy(theirs(x)), rtol=1e-5, atol=1e-5)
    restored = LayerNorm.from_config(ours.get_config())
    assert restored.epsilon == 1e-5 and not restored.autocast


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="gradients through jax.grad")
def test_pre_ln_model_logits_and_gradients_unchanged(monkeypatch):
    import jax

    def build(layer_norm_class):
        with monkeypatch.context() as patch:
            patch.setattr(layers, "LayerNorm", layer_norm_class)
            patch.setattr(models, "LayerNorm", layer_norm_class)
            model = TranslationTransformer(53, d_model=16, ffn_dim=32, num_heads=2, encoder_layers=3, decoder_layers=3,
                                           norm="pre", dropout=0.0)
            model.build()
        return model

    ours, before = build(LayerNorm), build(KerasLayerNorm)
    assert sum(isinstance(l, LayerNorm) for l in ours._flatten_layers()) == 3 * 2 + 3 * 3 + 2
    assert not any(isinstance(l, LayerNorm) for l in before._flatten_layers())
    rng = np.random.default_rng(1)
    # Random LayerNorm gammas and betas too (at init they are ones and zeros).
    before.set_weights([w + rng.normal(scale=0.2, size=w.shape).astype("float32") for w in ours.get_weights()])
    ours.set_weights(before.get_weights())
    source = rng.integers(3, 53, (4, 9)).astype("int32")
    source[0, -3:] = 0
    target = rng.integers(3, 53, (4, 8)).astype("int32")
    inputs, labels = {"source_ids": source, "decoder_input_ids": target[:, :-1]}, target[:, 1:]
    loss_fn = LabelSmoothedCrossEntropy(0.1)

    def loss_and_logits(model):
        def loss(trainable):
            logits, _ = model.stateless_call(trainable, [v.value for v in model.non_trainable_variables], inputs)
            return loss_fn(labels, logits), logits
        return jax.value_and_grad(loss, has_aux=True)([v.value for v in model.trainable_variables])

    (loss_a, logits_a), grads_a = loss_and_logits(ours)
    (loss_b, logits_b), grads_b = loss_and_logits(before)
    np.testing.assert_allclose(np.asarray(logits_a), np.asarray(logits_b), rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(float(loss_a), float(loss_b), rtol=1e-6)
    for variable, a, b in zip(ours.trainable_variables, grads_a, grads_b):
        a, b = np.asarray(a), np.asarray(b)
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(b).max())),
                                   err_msg=variable.path)
