"""One training step on two virtual CPU devices against the same step on one device.

    python tests/distributed_step.py jax data|model
    python tests/distributed_step.py tensorflow data

Run as a subprocess by tests/test_distribution.py: the two virtual devices must be set up before the
backend starts (jax: XLA_FLAGS; tensorflow: logical devices), so each check gets a fresh process.
Prints one JSON line: the two losses, the largest weight difference after the step, and how the
variables were laid out.
"""

import json
import os
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(backend, mode, precision="float32"):
    os.environ["KERAS_BACKEND"] = backend
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if backend == "jax":
        os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
    else:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np

    from harness import devices, nmt_data
    from harness.callbacks import EpochBatches, fit_input
    from models import LabelSmoothedCrossEntropy, TranslationTransformer

    rng = np.random.default_rng(0)
    rows, length, vocab = 6, 8, 50  # 6 rows: the second row's tokens are all padding in one place
    source = rng.integers(3, vocab, (rows, length)).astype("int32")
    target = rng.integers(3, vocab, (rows, length)).astype("int32")
    source[:, -2:] = nmt_data.PAD
    batch = ({"source_ids": source, "decoder_input_ids": target}, np.roll(target, -1, axis=1))

    def one_step(distribute):
        args = types.SimpleNamespace(distribute=distribute, model_parallel=2, precision=precision)
        setup = devices.configure(args)
        keras.utils.set_random_seed(7)
        with setup.scope():
            model = TranslationTransformer(vocab, d_model=16, ffn_dim=32, num_heads=2, encoder_layers=1,
                                           decoder_layers=1, norm="pre", dropout=0.0)
            model.build()
            model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LabelSmoothedCrossEntropy(0.1),
                          jit_compile=devices.compile_xla(setup))
            setup.build(model, batch)
            before = [np.asarray(keras.ops.convert_to_numpy(v.value), "float64") for v in model.weights]
            # The step as the scripts take it: model.fit over harness/callbacks.py's dataset (pad: rows for each device).
            dataset = EpochBatches(lambda epoch: [batch], 1, 1, pad=setup.pad)
            loss = model.fit(fit_input(dataset), epochs=1, verbose=0, shuffle=False).history["loss"][0]
        weights = [np.asarray(keras.ops.convert_to_numpy(v.value), "float64") for v in model.weights]
        layout = {}
        if backend == "jax":
            for v in model.weights:
                spec = getattr(v.value.sharding, "spec", None)
                layout[v.path] = [a for a in spec] if spec is not None else None
        return loss, weights, before, layout, setup

    loss_one, weights_one, before, _, _ = one_step("none")
    loss_two, weights_two, _, layout, setup = one_step(mode)
    print(json.dumps(dict(
        backend=backend, mode=mode, replicas=setup.replicas, devices=len(setup.devices),
        description=setup.description, loss_one=loss_one, loss_two=loss_two,
        max_weight_diff=max(float(np.abs(a - b).max()) for a, b in zip(weights_one, weights_two)),
        max_update=max(float(np.abs(a - b).max()) for a, b in zip(weights_one, before)),
        max_update_two=max(float(np.abs(a - b).max()) for a, b in zip(weights_two, before)),
        layout=layout)))


if __name__ == "__main__":
    main(*sys.argv[1:])
