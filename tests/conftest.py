"""Shared fixtures. The backend is chosen per process by KERAS_BACKEND (see run_all_backends.py)."""

import os
import time
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA (jax, and tensorflow's compiled steps) compiles the suite's many tiny programs, and the script runs
# the tests start, with LLVM's optimizations off: the same programs, their results equal to float32
# round-off, in less time (docs/testing.md). A flag given in XLA_FLAGS wins; `reproduce.py --certify`
# sets its own flags, so what it certifies is compiled as users compile it.
XLA_TESTS = "--xla_backend_optimization_level=0"
if XLA_TESTS.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), XLA_TESTS]))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from harness import devices  # noqa: E402
from harness.specs import NORMS  # noqa: E402, F401  (the placements, parametrized over by the tests)

devices.tune_runtime()  # as the scripts do: in-process tests draw the same random numbers


def once(what, backend="jax"):
    """A skip marker for a test whose subject is the same under every backend (`what`: process handling,
    files, a sweep's plan and tables): it runs once, under `backend`. The backends' own training, resuming
    and decoding have tests that run under each."""
    return pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "tensorflow") != backend,
                              reason=f"{what}, the same on every backend: run once, under {backend}")


def wait_for(condition, timeout, every=1.0):
    """Whether `condition()` came true within `timeout` seconds, asked every `every` seconds."""
    end = time.time() + timeout
    while time.time() < end:
        if condition():
            return True
        time.sleep(every)
    return False


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


def write_corpus(root, pairs, train, valid):
    """`pairs` (German, English) as a fairseq-layout corpus in `root`: the first `train` pairs, the next
    `valid`, the rest as {train,valid,test}.{de,en}. Returns `root`."""
    for split, chunk in (("train", pairs[:train]), ("valid", pairs[train:train + valid]),
                         ("test", pairs[train + valid:])):
        (root / f"{split}.de").write_text("\n".join(p[0] for p in chunk) + "\n", encoding="utf-8")
        (root / f"{split}.en").write_text("\n".join(p[1] for p in chunk) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """A small corpus in fairseq layout: 70 / 10 / 10 synthetic German-English pairs."""
    from harness import synthetic

    return write_corpus(tmp_path_factory.mktemp("corpus"), synthetic.synthetic_pairs(count=90, seed=11), 70, 10)


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield


def hub_attr(layer, name):
    """keras-hub's (private) sub-layer or weight `name`; skip the test if this keras-hub version lacks it."""
    import keras_hub

    value = getattr(layer, name, None)
    if value is None:
        pytest.skip(f"{type(layer).__name__} has no attribute {name!r} in keras-hub {keras_hub.__version__}")
    return value


class Copier:
    """Copies our weights into keras-hub's and records which of keras-hub's variables it set."""

    def __init__(self):
        self.assigned = set()

    def assign(self, target, value):
        target.assign(np.reshape(to_numpy(value), tuple(target.shape)))
        self.assigned.add(id(target))

    def dense(self, ours, theirs):
        self.assign(theirs.kernel, ours.kernel)
        self.assign(theirs.bias, ours.bias)

    def layer_norm(self, ours, theirs):
        self.assign(theirs.gamma, ours.gamma)
        self.assign(theirs.beta, ours.beta)
