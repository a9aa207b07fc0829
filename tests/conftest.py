"""Shared fixtures. The backend is chosen per process by KERAS_BACKEND (see run_all_backends.py)."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

NORMS = ("post", "pre", "deepnorm")


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


def tiny_translation(norm, vocab_size=37, **overrides):
    from models import TranslationTransformer

    args = dict(d_model=16, ffn_dim=32, num_heads=2, encoder_layers=2, decoder_layers=2, norm=norm, dropout=0.0)
    args.update(overrides)
    return TranslationTransformer(vocab_size, **args)


def tiny_bert(norm, vocab_size=41, **overrides):
    from models import BertMaskedLM

    args = dict(num_layers=2, d_model=16, num_heads=2, ffn_dim=32, max_positions=24, norm=norm, dropout=0.0,
                attention_dropout=0.0)
    args.update(overrides)
    return BertMaskedLM(vocab_size, **args)


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield
