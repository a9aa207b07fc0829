"""models.py: shapes, save/load, masks through the whole model, cached decoding, fit, cross-backend logits."""

import json
import os
import subprocess
import sys
import zipfile

import keras
import numpy as np
import pytest
from conftest import NORMS, tiny_bert, tiny_translation, to_numpy

from layers import deepnorm_constants
from models import BertMaskedLM, LabelSmoothedCrossEntropy, TranslationTransformer

HERE = os.path.dirname(os.path.abspath(__file__))


def translation_batch(batch=3, source_length=7, target_length=5, vocab=37):
    source = np.random.randint(3, vocab, (batch, source_length))
    source[0, -2:] = 0  # padding in the first sentence
    target = np.random.randint(3, vocab, (batch, target_length))
    return {"source_ids": source, "decoder_input_ids": target}


def bert_batch(batch=2, length=9, vocab=41):
    tokens = np.random.randint(3, vocab, (batch, length))
    tokens[1, -3:] = 0
    return {"token_ids": tokens, "segment_ids": (np.arange(length) >= 4).astype("int32")[None].repeat(batch, 0),
            "mask_positions": np.array([[1, 2, 5], [0, 3, 4]])}


@pytest.mark.parametrize("norm", NORMS)
def test_translation_shapes_and_final_norm(norm):
    model = tiny_translation(norm)
    logits = model(translation_batch())
    assert tuple(logits.shape) == (3, 5, 37)
    assert (model.encoder_final_norm is not None) == (norm == "pre")
    assert (model.decoder_final_norm is not None) == (norm == "pre")


@pytest.mark.parametrize("norm", NORMS)
def test_bert_shapes_and_heads(norm):
    model = tiny_bert(norm, next_sentence=True)
    batch = bert_batch()
    out = model(batch)
    assert tuple(out["mlm_logits"].shape) == (2, 3, 41)
    assert tuple(out["nsp_logits"].shape) == (2, 2)
    full = model({"token_ids": batch["token_ids"], "segment_ids": batch["segment_ids"]})
    assert tuple(full["mlm_logits"].shape) == (2, 9, 41)
    # Gathering the masked positions picks the same rows as the full-sequence logits.
    np.testing.assert_allclose(to_numpy(out["mlm_logits"])[0], to_numpy(full["mlm_logits"])[0, [1, 2, 5]], atol=1e-5)
    assert (model.final_norm is not None) == (norm == "pre")


def test_models_pass_deepnorm_constants_to_every_block():
    model = tiny_translation("deepnorm", encoder_layers=3, decoder_layers=2)
    c = deepnorm_constants(3, 2)
    assert all((b.alpha, b.beta) == pytest.approx(c["encoder"]) for b in model.encoder_blocks)
    assert all((b.alpha, b.beta) == pytest.approx(c["decoder"]) for b in model.decoder_blocks)
    bert = tiny_bert("deepnorm", num_layers=3, deepnorm_rule="adam")
    assert all((b.alpha, b.beta) == pytest.approx(deepnorm_constants(3, 0, "adam")["encoder"])
               for b in bert.encoder_blocks)
    post = tiny_translation("post")
    assert all((b.alpha, b.beta) == (1.0, 1.0) for b in post.encoder_blocks + post.decoder_blocks)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("kind", ["translation", "bert"])
def test_save_and_load_keras_file(kind, norm, tmp_path):
    if kind == "translation":
        model, batch = tiny_translation(norm, dropout=0.1), translation_batch()
    else:
        model, batch = tiny_bert(norm, next_sentence=True), bert_batch()
    before = model(batch)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded) is type(model)
    assert loaded.get_config() == model.get_config()
    after = loaded(batch)
    flatten = keras.tree.flatten
    for a, b in zip(flatten(before), flatten(after)):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_translation_model_uses_the_toolkits_qkv_gain_and_old_checkpoints_load_as_gain_1(tmp_path):
    """qkv_gain (default 1/sqrt(2), fairseq's and torchscale's) reaches every attention's W^Q, W^K, W^V; W^O
    keeps gain 1. A checkpoint whose config has no qkv_gain (saved before it existed) loads with gain 1."""
    d = 128
    model = TranslationTransformer(50, d_model=d, ffn_dim=256, num_heads=4, encoder_layers=2, decoder_layers=2)
    model.build()
    assert model.get_config()["qkv_gain"] == pytest.approx(2 ** -0.5)
    xavier_std = np.sqrt(1 / d)  # d x d: 2 / (d + d)
    blocks = model.encoder_blocks + model.decoder_blocks
    attentions = [a for b in blocks for a in (b.self_attention, getattr(b, "cross_attention", None)) if a]
    assert len(attentions) == 6 and all(b.qkv_gain == pytest.approx(2 ** -0.5) for b in blocks)
    q = np.concatenate([to_numpy(a.query_dense.kernel).ravel() for a in attentions])
    o = np.concatenate([to_numpy(a.output_dense.kernel).ravel() for a in attentions])
    assert abs(q.std() / (2 ** -0.5 * xavier_std) - 1) < 0.03 and abs(o.std() / xavier_std - 1) < 0.03
    theory = TranslationTransformer(50, d_model=d, ffn_dim=256, num_heads=4, encoder_layers=1, decoder_layers=1,
                                    qkv_gain=1.0)
    theory.build()
    assert abs(to_numpy(theory.encoder_blocks[0].self_attention.key_dense.kernel).std() / xavier_std - 1) < 0.05

    small = tiny_translation("post")
    batch = translation_batch()
    expected = to_numpy(small(batch))
    path, old = str(tmp_path / "model.keras"), str(tmp_path / "old.keras")
    small.save(path)
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(old, "w") as target:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename == "config.json":
                config = json.loads(data)
                del config["config"]["qkv_gain"]  # as saved before the argument existed
                data = json.dumps(config).encode()
            target.writestr(item, data)
    loaded = keras.models.load_model(old)
    assert loaded.get_config()["qkv_gain"] == 1.0
    assert all(b.qkv_gain == 1.0 for b in loaded.encoder_blocks + loaded.decoder_blocks)
    np.testing.assert_array_equal(to_numpy(loaded(batch)), expected)


def test_separate_source_vocabulary_has_its_own_embedding(tmp_path):
    """Separate dictionaries: the encoder embeds with E_src, the decoder and the output share E."""
    model = tiny_translation("pre", vocab_size=13, source_vocab_size=41)
    batch = translation_batch(vocab=13)
    batch["source_ids"][1, 0] = 40  # an id only the source vocabulary has
    logits = to_numpy(model(batch))
    assert logits.shape == (3, 5, 13)
    assert model.source_embedding.embeddings.shape[0] == 41 and model.embedding.embeddings.shape[0] == 13
    joint = tiny_translation("pre", vocab_size=13)
    joint.build()
    assert len(model.trainable_weights) == len(joint.trainable_weights) + 1
    model.source_embedding.embeddings.assign(np.zeros((41, model.d_model), "float32"))  # the encoder's input only
    assert np.abs(to_numpy(model(batch)) - logits).max() > 1e-4
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.get_config()["source_vocab_size"] == 41
    np.testing.assert_array_equal(to_numpy(loaded(batch)), to_numpy(model(batch)))


@pytest.mark.parametrize("norm", NORMS)
def test_source_padding_does_not_change_the_translation(norm):
    model = tiny_translation(norm)
    batch = translation_batch()
    padded = dict(batch, source_ids=np.pad(batch["source_ids"], ((0, 0), (0, 4))))
    np.testing.assert_allclose(to_numpy(model(batch)), to_numpy(model(padded)), atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_packed_rows_give_each_pair_the_logits_it_has_alone(norm):
    """Thirty pairs packed several to a row (nmt_data.pack_batches) and one to a row (make_batches):
    each pair's logits, and so the packed batch's loss, are the same (attention stays within a pair)."""
    from harness import nmt_data

    rng = np.random.default_rng(0)
    examples = [(list(rng.integers(3, 37, rng.integers(1, 9))) + [nmt_data.EOS],
                 list(rng.integers(3, 37, rng.integers(1, 9)))) for _ in range(30)]
    model = tiny_translation(norm)
    packed = nmt_data.pack_batches(examples, 64, length=16)
    assert len(packed) < 30 / 4  # several pairs to a row
    alone = {}
    for inputs, labels in nmt_data.make_batches(examples, 10000, buckets=(16,)):
        logits = to_numpy(model(inputs))
        for row in np.flatnonzero((labels != 0).any(1)):
            src = inputs["source_ids"][row]
            alone[tuple(src[src != 0])] = logits[row, :(labels[row] != 0).sum()]
    seen = 0
    for inputs, labels in packed:
        logits = to_numpy(model(inputs))
        for row in range(len(labels)):
            for k in range(1, inputs["source_segments"][row].max() + 1):
                src = inputs["source_ids"][row][inputs["source_segments"][row] == k]
                np.testing.assert_allclose(logits[row][inputs["decoder_segments"][row] == k], alone[tuple(src)],
                                           atol=2e-5)
                seen += 1
    assert seen == len(alone) == 30


@pytest.mark.parametrize("norm", NORMS)
def test_target_position_never_sees_later_tokens(norm):
    model = tiny_translation(norm)
    batch = translation_batch()
    changed = dict(batch, decoder_input_ids=batch["decoder_input_ids"].copy())
    changed["decoder_input_ids"][:, 3:] = 5
    a, b = to_numpy(model(batch)), to_numpy(model(changed))
    np.testing.assert_allclose(a[:, :3], b[:, :3], atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_bert_padding_does_not_change_real_tokens(norm):
    model = tiny_bert(norm)
    batch = bert_batch()
    a = to_numpy(model.encode(batch["token_ids"], batch["segment_ids"]))
    longer = np.pad(batch["token_ids"], ((0, 0), (0, 3)))
    b = to_numpy(model.encode(longer, np.pad(batch["segment_ids"], ((0, 0), (0, 3)))))
    np.testing.assert_allclose(a[0], b[0, :9], atol=1e-5)


@pytest.mark.parametrize("norm", NORMS)
def test_cached_decoding_equals_the_full_forward_pass(norm):
    model = tiny_translation(norm, encoder_layers=2, decoder_layers=3)
    batch = translation_batch(target_length=6)
    full = to_numpy(model(batch))
    encoder_output, source_mask = model.encode(batch["source_ids"])
    cross = model.cross_attention_cache(encoder_output)
    cache = model.init_cache(batch_size=3, max_length=8)
    for i in range(6):
        logits, cache = model.decode_step(batch["decoder_input_ids"][:, i:i + 1], i, source_mask, cache, cross)
        np.testing.assert_allclose(to_numpy(logits), full[:, i], atol=1e-4, err_msg=f"position {i}")


def test_label_smoothed_cross_entropy_matches_fairseq_formula():
    logits = np.random.normal(size=(2, 3, 7)).astype("float32")
    labels = np.array([[1, 2, 0], [3, 0, 0]])
    eps = 0.1
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    q = np.full(logits.shape, eps / 6)
    np.put_along_axis(q, labels[..., None], 1 - eps, axis=-1)
    per_token = -(q * logp).sum(-1)
    want = per_token[labels != 0].mean()
    got = float(to_numpy(LabelSmoothedCrossEntropy(eps, pad_id=0)(labels, logits)))
    assert got == pytest.approx(want, rel=1e-5)
    plain = float(to_numpy(LabelSmoothedCrossEntropy(0.0)(labels, logits)))
    assert plain == pytest.approx(-np.take_along_axis(logp, labels[..., None], -1)[..., 0][labels != 0].mean(), rel=1e-5)
    with pytest.raises(ValueError, match="epsilon must be in"):
        LabelSmoothedCrossEntropy(1.5)


def _changed(before, after):
    return max(np.abs(a - b).max() for a, b in zip(before, after))


@pytest.mark.parametrize("norm", NORMS)
def test_one_fit_step_translation(norm):
    model = tiny_translation(norm, dropout=0.1)
    batch = translation_batch()
    labels = np.random.randint(3, 37, (3, 5))
    model.compile(optimizer=keras.optimizers.Adam(1e-3, beta_2=0.98), loss=LabelSmoothedCrossEntropy(0.1))
    model(batch)
    before = [to_numpy(w) for w in model.trainable_weights]
    history = model.fit(batch, labels, batch_size=3, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert _changed(before, [to_numpy(w) for w in model.trainable_weights]) > 0


@pytest.mark.parametrize("norm", NORMS)
def test_one_fit_step_bert(norm):
    model = tiny_bert(norm, next_sentence=True)
    batch = bert_batch()
    labels = {"mlm_logits": np.random.randint(3, 41, (2, 3)), "nsp_logits": np.array([0, 1])}
    model.compile(optimizer=keras.optimizers.AdamW(1e-3),
                  loss={"mlm_logits": LabelSmoothedCrossEntropy(0.0, pad_id=-1),
                        "nsp_logits": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
    model(batch)
    before = [to_numpy(w) for w in model.trainable_weights]
    history = model.fit(batch, labels, batch_size=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert _changed(before, [to_numpy(w) for w in model.trainable_weights]) > 0


@pytest.mark.parametrize("make, message", [
    (lambda: tiny_translation("preln"), "norm must be one of"),
    (lambda: tiny_bert("none"), "norm must be one of"),
    (lambda: tiny_translation("deepnorm", deepnorm_rule="sgd"), "use rule='paper' for an encoder-decoder"),
    (lambda: tiny_translation("post", encoder_layers=0), "encoder_layers must be a positive integer"),
    (lambda: TranslationTransformer(0), "vocab_size must be a positive integer"),
    (lambda: BertMaskedLM(100, num_layers=2, d_model=10, num_heads=4), "must be divisible by num_heads"),
])
def test_bad_model_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def installed_backends():
    sys.path.insert(0, HERE)
    from run_all_backends import installed_backends as found

    return found()


def test_same_weights_give_the_same_logits_on_every_backend(tmp_path):
    """Weights made here are loaded by a subprocess on each installed backend; logits agree to 1e-4."""
    backends = installed_backends()
    if len(backends) < 2:
        pytest.skip(f"only {backends} installed")
    home = "jax" if "jax" in backends else backends[0]
    if keras.backend.backend() != home:
        pytest.skip(f"compares all backends at once; runs in the {home} process")
    script = os.path.join(HERE, "backend_logits.py")
    arrays = {}
    for name, model, inputs in _cross_backend_models():
        arrays.update({f"{name}/weight{i}": to_numpy(w) for i, w in enumerate(model.get_weights())})
        arrays.update({f"{name}/input/{k}": v for k, v in inputs.items()})
    weights = str(tmp_path / "weights.npz")
    np.savez(weights, **arrays)
    results = {}
    for backend in backends:
        out = str(tmp_path / f"logits_{backend}.npz")
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
        proc = subprocess.run([sys.executable, script, weights, out], env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        results[backend] = dict(np.load(out))
    reference = results[backends[0]]
    assert len(reference) == 6
    for backend in backends[1:]:
        for key, value in reference.items():
            np.testing.assert_allclose(results[backend][key], value, atol=1e-4, err_msg=f"{backend} {key}")
    print(json.dumps({b: sorted(r) for b, r in results.items()}))


def _cross_backend_models():
    """The models compared across backends; backend_logits.py builds the same ones."""
    np.random.seed(7)
    keras.utils.set_random_seed(7)
    translation_inputs = translation_batch()
    bert_inputs = bert_batch()
    for norm in NORMS:
        model = tiny_translation(norm)
        model(translation_inputs)
        yield f"translation_{norm}", model, translation_inputs
        model = tiny_bert(norm)
        model(bert_inputs)
        yield f"bert_{norm}", model, bert_inputs
