"""Distribution and precision (harness/devices.py): two virtual CPU devices against one, bf16 training."""

import json
import os
import subprocess
import sys
import types

import keras
import numpy as np
import pytest

import train_nmt
from harness import devices, specs
from harness.console import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BACKEND = keras.backend.backend()


def _two_device_step(backend, mode):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "distributed_step.py"), backend, mode],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(BACKEND != "jax", reason="jax's DataParallel")
def test_jax_data_parallel_step_equals_one_device():
    out = _two_device_step("jax", "data")
    assert out["replicas"] == 2 and out["devices"] == 2
    assert out["loss_two"] == pytest.approx(out["loss_one"], rel=1e-5)
    assert out["max_update"] > 1e-3  # the step really moved the weights ...
    assert out["max_weight_diff"] < 1e-5  # ... and the same way on two devices as on one


@pytest.mark.skipif(BACKEND != "jax", reason="jax's ModelParallel")
def test_jax_model_parallel_shards_kernels_and_keeps_the_step():
    out = _two_device_step("jax", "model")
    assert out["loss_two"] == pytest.approx(out["loss_one"], rel=1e-5)
    assert out["max_weight_diff"] < 1e-5
    layout = out["layout"]
    sharded = {path: axes for path, axes in layout.items() if axes and "model" in axes}
    for name, axes in (("self_attention/query/kernel", [None, "model"]), ("self_attention/output/kernel", ["model", None]),
                       ("feed_forward/w1/kernel", [None, "model"]), ("feed_forward/w2/kernel", ["model", None]),
                       ("cross_attention/value/kernel", [None, "model"])):
        matches = [axes_ for path, axes_ in sharded.items() if path.endswith(name)]
        assert matches and all(m == axes for m in matches), (name, matches)
    assert all("model" not in (axes or []) for path, axes in layout.items() if "layer_norm" in path)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute.MirroredStrategy")
def test_tf_mirrored_step_equals_one_device():
    out = _two_device_step("tensorflow", "data")
    assert out["replicas"] == 2
    assert out["loss_two"] == pytest.approx(out["loss_one"], rel=1e-5)
    assert out["max_update"] > 1e-3
    assert out["max_weight_diff"] < 1e-5


def _args(**kw):
    return types.SimpleNamespace(**dict(dict(distribute="auto", model_parallel=2, precision="float32"), **kw))


def test_pad_adds_rows_that_the_loss_ignores():
    setup = devices.Setup("data", ["a", "b", "c"], replicas=3)
    inputs = {"source_ids": np.ones((4, 5), "int32"), "decoder_input_ids": np.ones((4, 5), "int32")}
    padded_inputs, padded_labels = setup.pad((inputs, np.ones((4, 5), "int32")))
    assert padded_labels.shape == (6, 5) and padded_inputs["source_ids"].shape == (6, 5)
    assert (padded_labels[4:] == 0).all() and (padded_labels[:4] == 1).all()
    same = setup.pad(({"x": np.ones((6, 2))}, np.ones((6, 2))))
    assert same[1].shape == (6, 2)


@pytest.mark.parametrize("kw, message", [
    (dict(distribute="pipeline"), "--distribute pipeline: unknown"),
    (dict(precision="float8"), "--precision float8: unknown"),
    (dict(model_parallel=0), "--model-parallel must be a positive integer"),
])
def test_bad_arguments(kw, message):
    with pytest.raises(UsageError, match=message):
        specs.check_distribution_arguments(_args(**kw))


def test_more_devices_than_exist_is_a_usage_error():
    if BACKEND == "jax":
        with pytest.raises(UsageError, match="more devices than"):
            devices.configure(_args(distribute="model", model_parallel=64))
    elif BACKEND == "torch":
        with pytest.raises(UsageError, match="one device"):
            devices.configure(_args(distribute="data"))
    else:
        with pytest.raises(UsageError, match="implemented for KERAS_BACKEND=jax"):
            devices.configure(_args(distribute="model"))


@pytest.fixture
def restore_policy():
    yield
    keras.config.set_dtype_policy("float32")


def test_bfloat16_training_keeps_norms_softmax_and_loss_in_float32(tmp_path, corpus_dir, restore_policy):
    out = tmp_path / "run"
    code = train_nmt.main(["--preset", "tiny", "--data-dir", str(corpus_dir), "--max-updates", "3",
                           "--precision", "mixed_bfloat16", "--out", str(out), "--beam", "1", "--max-len-b", "20"])
    assert code == 0
    rows = [line.split(",") for line in (out / "metrics.csv").read_text().splitlines()]
    header, first = rows[0], rows[1]
    assert np.isfinite(float(first[header.index("valid_loss")]))
    model = keras.models.load_model(out / "checkpoints" / "epoch1.keras")
    assert all(v.dtype == "float32" for v in model.weights)  # variables stay float32
    block = model.encoder_blocks[0]
    assert block.compute_dtype == "bfloat16"
    x = keras.random.normal((2, 5, model.d_model))
    assert keras.backend.standardize_dtype(block(x).dtype) == "bfloat16"
    logits = model({"source_ids": np.ones((2, 4), "int32"), "decoder_input_ids": np.ones((2, 3), "int32")})
    from models import LabelSmoothedCrossEntropy

    loss = LabelSmoothedCrossEntropy(0.1)(np.ones((2, 3), "int32"), logits)
    assert keras.backend.standardize_dtype(loss.dtype) == "float32"


def _page_faults_of_a_fresh_block(size):
    """Minor page faults of malloc(size), writing every byte, free."""
    import ctypes
    import resource

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    assert block
    ctypes.memset(block, 1, size)
    libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@pytest.mark.skipif(not (sys.platform.startswith("linux") and __import__("platform").libc_ver()[0] == "glibc"),
                    reason="glibc's mallopt")
def test_tune_runtime_keeps_a_freed_block_for_the_next_step():
    # An XLA step allocates its temporaries as one block and frees it; without the setting glibc unmaps
    # it and the next step faults in every page again (size / 4 KiB faults).
    assert "malloc" in devices.tune_runtime()
    size = 64 << 20
    _page_faults_of_a_fresh_block(size)  # the heap grows once
    assert _page_faults_of_a_fresh_block(size) < size // 4096 // 20


@pytest.mark.skipif(BACKEND != "jax", reason="jax's generator")
def test_tune_runtime_gives_jax_dropout_philox_with_keras_seeds():
    import jax

    assert devices.tune_runtime()["jax_prng"] == "philox4x32" == jax.config.jax_default_prng_impl
    x = np.ones((64, 512), "float32")
    first = keras.ops.convert_to_numpy(keras.random.dropout(x, 0.1, seed=keras.random.SeedGenerator(3)))
    again = keras.ops.convert_to_numpy(keras.random.dropout(x, 0.1, seed=keras.random.SeedGenerator(3)))
    other = keras.ops.convert_to_numpy(keras.random.dropout(x, 0.1, seed=keras.random.SeedGenerator(4)))
    np.testing.assert_array_equal(first, again)  # seeded: resuming a run draws the same masks
    assert not np.array_equal(first, other)
    assert abs((first == 0).mean() - 0.1) < 0.01
    np.testing.assert_allclose(first[first != 0], 1 / 0.9, rtol=1e-6)
