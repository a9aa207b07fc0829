"""Run directories and the files in them, without Keras: atomic writes, JSON and CSV, plots.

    out, state_path = open_run_dir("runs/pre-adam", resume=False)   # created, writable, no run in it yet
    write_json(os.path.join(out, "config.json"), config)               # never half-written (write_atomic)
    write_csv(os.path.join(out, "metrics.csv"), rows); rows = read_csv(...)
    plot_panels(os.path.join(out, "curves.png"), "epoch", [("valid loss", {"Post-LN": (xs, ys, None)})])
"""

import csv
import io
import json
import math
import os

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from errors import UsageError  # noqa: E402
from processes import is_chief  # noqa: E402


def write_atomic(path, data):
    """Write bytes or text to `path` through a temporary file and a rename: never half-written. Only the
    chief of several processes writes (`processes.is_chief`); on the others this does nothing, as do
    `plot_panels` and `prepare_out_dir`'s creating (and `training.save_checkpoint`'s file)."""
    if not is_chief():
        return
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def write_json(path, obj):
    write_atomic(path, json.dumps(obj, indent=2, default=_jsonable) + "\n")


def _jsonable(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    return str(value)


def write_csv(path, rows):
    if not rows:
        return
    fields = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(path, buffer.getvalue())


def read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def prepare_out_dir(path, flag="--out"):
    """Create `path` and check it can be written, or raise UsageError naming it (the chief alone)."""
    if not is_chief():
        return path
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write-test{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as error:
        raise UsageError(f"{flag} {path}: cannot write there ({error.strerror or error}); choose another directory")
    return path


def open_run_dir(path, resume, what="finished epoch"):
    """The run directory of a training run: created and writable; with `resume` it must hold a run
    (its state.json), without it it must not. Returns (path, path of state.json)."""
    prepare_out_dir(path)
    state_path = os.path.join(path, "state.json")
    if resume and not os.path.exists(state_path):
        raise UsageError(f"--resume: {path} has no {what} to resume from; run without --resume")
    if not resume and os.path.exists(state_path):
        raise UsageError(f"{path} already holds a run; pass --resume to continue it or choose another --out")
    return path, state_path


def plot_panels(path, xlabel, panels):
    """Side-by-side panels of lines: panels = [(ylabel, {name: (xs, ys, error bars or None)})], each
    with `xlabel` or, as a third element of its tuple, its own."""
    if not is_chief():
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (ylabel, lines, *own) in zip(axes[0], panels):
        for name, (xs, ys, errs) in lines.items():
            ax.errorbar(xs, ys, yerr=errs, marker="o", markersize=3, capsize=3, label=name)
        ax.set_xlabel(own[0] if own else xlabel)
        ax.set_ylabel(ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and updates
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=100)
    os.replace(path + ".tmp.png", path)
    plt.close(fig)


def is_finite(value):
    return value is not None and math.isfinite(float(value))
