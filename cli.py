"""What the scripts' command lines share, without Keras (--help and the KERAS_BACKEND check need no backend).

    p.add_argument("--norm", choices=NORMS)
    p.add_argument("--depths", type=int_list)
    show_presets(p, PRESETS)    # each preset-dependent flag's help ends in [preset: cpu 128, iwslt 512, ...]

The scripts, and the modules they import when they start, import Keras and the modules built on it
(layers, models, schedules, optimizers) inside the functions that need a backend: `--help` and the
one-line error for a bad KERAS_BACKEND (`training.check_backend`) work without one.
"""

import argparse

NORMS = ("post", "pre", "deepnorm")  # layers.NORMS, here without importing keras (a test keeps them equal)
NORM_NAMES = {"post": "Post-LN", "pre": "Pre-LN", "deepnorm": "DeepNorm"}  # in plots and tables


def int_list(text):
    """An argparse type: "6,12,24" -> [6, 12, 24], positive integers."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers, e.g. 6,12,24")
    return values


def show_presets(parser, presets):
    """End the help of each flag that `presets` (name -> {dest: value}) set with its value at every preset."""
    first = next(iter(presets.values()))
    for action in parser._actions:
        if action.dest in first:
            values = ", ".join(f"{name} {_shown(preset[action.dest])}" for name, preset in presets.items())
            action.help = f"{action.help or ''} [preset: {values}]".strip()


def _shown(value):
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
