"""A few training steps of the tiny translation model, in one process or as one of several.

    python tests/multiprocess_worker.py OUT.npz [--loop fit|train_on_batch] [--steps N] [--stop-after K]

Run by tests/test_multiprocess.py: once alone on the whole global batches, and once in each of two
processes that find each other from the environment (jax: JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID; tensorflow: TF_CONFIG), each feeding its own rows of every global batch: `--loop fit`
gives `devices.Setup.feed` of each batch to `model.fit` (jax), `--loop train_on_batch` gives
`Setup.shard(batch)` to `train_on_batch` step by step (both backends). The chief writes the final weights to OUT.npz;
every process prints one JSON line (process index, count, devices, replicas, chief or not) on standard
error: `devices.configure` sends the standard output of all but the chief to /dev/null.
`--stop-after K` makes process 1 kill itself (SIGKILL) after K steps: a dead peer.
"""

import argparse
import json
import os
import signal
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def global_batches(steps, rows=6, length=8, vocab=200):
    """Fixed global batches: 6 rows, so two processes get 3 rows each (and the padding path is not hit)."""
    import numpy as np

    rng = np.random.default_rng(0)
    batches = []
    for _ in range(steps):
        source = rng.integers(3, vocab, (rows, length)).astype("int32")
        target = rng.integers(3, vocab, (rows, length)).astype("int32")
        batches.append(({"source_ids": source, "decoder_input_ids": target}, np.roll(target, -1, axis=1)))
    return batches


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--stop-after", type=int, default=0)
    p.add_argument("--optimizer", default="adam", choices=("adam", "sgd"))
    p.add_argument("--loop", default="fit", choices=("fit", "train_on_batch"))
    p.add_argument("--peer-timeout", type=int, default=distribution_default_timeout())
    a = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    import keras
    import numpy as np

    import train_nmt
    from harness import devices, files
    from models import LabelSmoothedCrossEntropy, TranslationTransformer

    devices.tune_runtime()
    setup = devices.configure(types.SimpleNamespace(distribute="auto", model_parallel=2, precision="float32",
                                                         peer_timeout=a.peer_timeout))
    tiny = train_nmt.PRESETS["tiny"]
    batches = global_batches(a.steps, vocab=tiny["vocab_size"])
    keras.utils.set_random_seed(7)
    with setup.scope():
        model = TranslationTransformer(tiny["vocab_size"], d_model=tiny["d_model"], ffn_dim=tiny["ffn_dim"],
                                       num_heads=tiny["heads"], encoder_layers=tiny["encoder_layers"],
                                       decoder_layers=tiny["decoder_layers"], norm="pre", dropout=tiny["dropout"])
        model.build()
        optimizer = (keras.optimizers.Adam(tiny["lr"], beta_1=0.9, beta_2=0.98, epsilon=1e-8) if a.optimizer == "adam"
                     else keras.optimizers.SGD(0.5))
        model.compile(optimizer=optimizer,
                      loss=LabelSmoothedCrossEntropy(0.1), jit_compile=devices.compile_xla(setup))
    before = [np.array(keras.ops.convert_to_numpy(v.value), "float64") for v in model.weights]
    callbacks = []
    if a.stop_after and setup.process_index == 1:
        class Die(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch + 1 >= a.stop_after:
                    os.kill(os.getpid(), signal.SIGKILL)  # no goodbye: the peer sees only a missing process
        callbacks.append(Die())
    if a.loop == "fit":
        model.fit((setup.feed(batch) for batch in batches), epochs=1, steps_per_epoch=len(batches), shuffle=False,
                  verbose=0, callbacks=callbacks)
    else:
        setup.build(model, batches[0])
        for step, batch in enumerate(batches):
            model.train_on_batch(*setup.shard(batch))
            for callback in callbacks:
                callback.on_train_batch_end(step)
    weights = [np.array(keras.ops.convert_to_numpy(v.value), "float64") for v in model.weights]
    if files.is_chief():
        np.savez(a.out, **{v.path: w for v, w in zip(model.weights, weights)}, update=max(float(np.abs(w - b).max()) for w, b in zip(weights, before)))
    print(json.dumps(dict(process_index=files.process_index(), processes=files.process_count(),
                          chief=files.is_chief(), devices=len(setup.devices), replicas=setup.replicas,
                          config=setup.config(), description=setup.description)), file=sys.stderr, flush=True)


def distribution_default_timeout():
    from harness import specs

    return specs.PEER_TIMEOUT_S


if __name__ == "__main__":
    main()
