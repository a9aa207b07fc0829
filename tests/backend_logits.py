"""Helper for test_models.test_same_weights_give_the_same_logits_on_every_backend (not a test).

Usage: KERAS_BACKEND=... python tests/backend_logits.py WEIGHTS.npz OUT.npz
Builds the tiny models of that test under the chosen backend, loads the given weights and inputs,
and writes the logits (the masked-LM logits for BERT).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from conftest import NORMS, tiny_bert, tiny_translation, to_numpy  # noqa: E402


def main(weights_path, out_path):
    data = np.load(weights_path)
    results = {}
    for norm in NORMS:
        for kind, make in (("translation", tiny_translation), ("bert", tiny_bert)):
            name = f"{kind}_{norm}"
            inputs = {k.split("/")[-1]: data[k] for k in data.files if k.startswith(f"{name}/input/")}
            model = make(norm)
            model(inputs)
            weights = [data[f"{name}/weight{i}"] for i in range(len(model.get_weights()))]
            model.set_weights(weights)
            out = model(inputs)
            results[name] = to_numpy(out if kind == "translation" else out["mlm_logits"])
    np.savez(out_path, **results)


if __name__ == "__main__":
    main(*sys.argv[1:3])
