"""The project's figures, without Keras: panels of curves from metrics rows, and the analyses' plots.

    plot_panels("runs/pre/curves.png", "updates", [("valid loss", {"Pre-LN": (xs, ys, None)})])
    plot_runs(curves, path)                  # translation runs: validation loss and greedy BLEU
    plot_depth(table, curves, path)          # the depth sweep: test BLEU against depth, loss per depth
    plot_panels(path, "updates", bert_loss_panels(curves))   # BERT runs: masked-LM loss and accuracy
    plot_protocol(arms, curves, keys, score, folder, name)  # a fair-test protocol: its arms and their rate grids
    fig = plot_fig3_depth(rows, result)      # analyze_grads.py: one figure per analysis (plot_fig3_layers,
                                             # plot_fig3_depth, plot_lemma2, plot_deepnet)

Only the chief of several processes draws (`chief.is_chief`).
"""

import os
import re

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator, NullFormatter  # noqa: E402

from harness.specs import NORM_NAMES  # noqa: E402
from harness.files import is_chief, is_finite, writing  # noqa: E402


def plot_panels(path, xlabel, panels, log_x=False):
    """Side-by-side panels of lines: panels = [(ylabel, {name: (xs, ys, error bars or None)})], each
    with `xlabel` or, as a third element of its tuple, its own; `log_x`: a logarithmic x axis."""
    if not is_chief():
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (ylabel, lines, *own) in zip(axes[0], panels):
        for name, (xs, ys, errs) in lines.items():
            ax.errorbar(xs, ys, yerr=errs, marker="o", markersize=3, capsize=3, label=name)
        ax.set_xlabel(own[0] if own else xlabel)
        ax.set_ylabel(ylabel)
        if log_x:  # a labelled tick at each x of the lines (the rates of a grid), none between
            ax.set_xscale("log")
            ticks = sorted({x for xs, _, _ in lines.values() for x in xs})
            ax.set_xticks(ticks, [f"{x:g}" for x in ticks], rotation=45 if len(ticks) > 5 else 0)
            ax.xaxis.set_minor_formatter(NullFormatter())
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and updates
    axes[0][-1].legend(fontsize=8)
    save_figure(fig, path)


def save_figure(fig, path, dpi=100):
    """`fig` as a PNG at `path` (through a temporary file and a rename), then closed."""
    if is_chief():
        fig.tight_layout()
        with writing(path, path + ".tmp.png"):
            fig.savefig(path + ".tmp.png", dpi=dpi)
            os.replace(path + ".tmp.png", path)
    plt.close(fig)


# The curves of a run's metrics rows that its figures draw, by job: [(metrics.csv column, label)].
CURVES = {"translation": [("valid_loss", "validation loss"), ("valid_bleu", "validation BLEU (greedy)")],
          "bert": [("valid_loss", "validation masked-LM loss"), ("valid_accuracy", "validation masked-LM accuracy")]}


def curve_panels(curves, job):
    """One panel for each of `job`'s CURVES, one line a run of `curves` ({name: metrics rows}): its updates
    and values where the row holds a finite one."""
    def points(rows, key):
        kept = [r for r in rows if r.get(key) not in (None, "") and is_finite(r[key])]
        return [int(r["updates"]) for r in kept], [float(r[key]) for r in kept], None
    return [(label, {name: points(rows, key) for name, rows in curves.items()}) for key, label in CURVES[job]]


def plot_runs(curves, path):
    """Validation loss and greedy BLEU against updates, one line per run."""
    plot_panels(path, "updates", curve_panels(curves, "translation"))


def plot_depth(table, curves, path):
    """DeepNet's Figure 1 / Table 1 at this scale: test BLEU against depth, one line per placement
    (a diverged run at 0), and the training loss against updates, one panel per depth."""
    bleu = {}
    for row in table:
        xs, ys, _ = bleu.setdefault(NORM_NAMES[row["norm"]], ([], [], None))
        xs.append(int(row["layers"]))
        ys.append(float(row["test_tokenized_bleu"] or 0.0))
    panels = [("test BLEU (tokenized)", bleu, "layers (encoder = decoder)")]
    for depth in sorted({int(row["layers"]) for row in table}):
        panels.append((f"training loss, {depth} + {depth} layers", {
            NORM_NAMES[row["norm"]]: ([int(r["updates"]) for r in curves[row["run"]]],
                                 [float(r["train_loss"]) for r in curves[row["run"]]], None)
            for row in table if int(row["layers"]) == depth}, "updates"))
    plot_panels(path, None, panels)


def plot_protocol(arms, curves, keys, score, folder, name):
    """A fair-test protocol's figures (results/protocols.md) in `folder`, from `arms` ({arm: (name, grid
    {lr: row of seed 1}, chosen rate, rows of its seeds)}, reproduction/tables.py's `protocol_arms`):
    - grid-NAME.png (grid.png without a name): each arm's final validation loss and `score` ((results
      column, label): test BLEU, or BERT's masked-LM accuracy), seed 1, against the peak rate;
    - curves-NAME.png: `keys` ([(metrics column, label)]) against updates at each arm's chosen rate, the
      mean over its seeds with bars from the lowest to the highest seed (an arm none of whose rates passes
      its premise has no chosen rate, and no line);
    - with arms named PLACEMENT-NL (the depth protocol), depth.png: each placement's mean test BLEU at its
      chosen rate against the depth N."""
    def value(row, key):
        v = row.get(key)
        return float(v) if v not in (None, "") and is_finite(v) else None

    suffix = f"-{name}" if name else ""
    grid = []
    for key, label in (("final_valid_loss", "final validation loss"), score):
        lines = {}
        for arm in arms.values():
            points = [(lr, value(row, key)) for lr, row in arm.grid.items() if value(row, key) is not None]
            lines[arm.name] = ([lr for lr, _ in points], [v for _, v in points], None)
        grid.append((label + " (seed 1)", lines))
    plot_panels(os.path.join(folder, f"grid{suffix}.png"), "peak learning rate", grid, log_x=True)

    panels = []
    for key, label in keys:
        lines = {}
        for arm in (arm for arm in arms.values() if arm.seeds):  # an arm with no rate that passes its premise: none
            runs = [[r for r in curves[seed["run"]] if is_finite(r[key])] for seed in arm.seeds]
            updates = sorted(set.intersection(*({int(r["updates"]) for r in rows} for rows in runs)))
            at = [{int(r["updates"]): float(r[key]) for r in rows} for rows in runs]
            values = np.array([[a[u] for u in updates] for a in at]).reshape(len(at), len(updates))
            mean = values.mean(axis=0)
            errs = [mean - values.min(axis=0), values.max(axis=0) - mean] if len(at) > 1 else None
            lines[f"{arm.name}, lr {arm.rate:g}, {len(at)} seed{'s' if len(at) > 1 else ''}"] = (updates, mean, errs)
        panels.append((label + " (mean over seeds)", lines))
    plot_panels(os.path.join(folder, f"curves{suffix}.png"), "updates", panels)

    depths = {arm: re.fullmatch(r"(.+)-(\d+)L", arm) for arm in arms}
    if arms and all(depths.values()):
        lines = {}
        for arm_name, match in sorted(depths.items(), key=lambda item: int(item[1].group(2))):
            scores = [value(row, "test_tokenized_bleu") or 0.0 for row in arms[arm_name].seeds]  # diverged: 0
            xs, ys, errs = lines.setdefault(match.group(1), ([], [], [[], []]))
            xs.append(int(match.group(2)))
            ys.append(float(np.mean(scores)))
            errs[0].append(ys[-1] - min(scores))
            errs[1].append(max(scores) - ys[-1])
        plot_panels(os.path.join(folder, "depth.png"), "layers (encoder = decoder)",
                    [("test BLEU, mean of seeds at the chosen rate", lines)])


def bert_loss_panels(curves):
    """Validation loss and accuracy against updates, one line a run (rows of metrics.csv)."""
    return curve_panels(curves, "bert")


# --- analyze_grads.py's figures ----------------------------------------------------------------------


def plot_fig3_layers(rows, result):
    norms = list(dict.fromkeys(r["norm"] for r in rows))
    fig, axes = plt.subplots(1, len(norms), figsize=(4.2 * len(norms), 3.4), sharey=True, squeeze=False)
    for ax, norm in zip(axes[0], norms):
        for stack, offset in (("encoder", 0), ("decoder", 0)):
            for matrix, marker in (("W1", "o"), ("W2", "s")):
                sel = [r for r in rows if r["norm"] == norm and r["stack"] == stack and r["matrix"] == matrix]
                n_enc = max(r["layer"] for r in rows if r["stack"] == "encoder")
                xs = [r["layer"] + (n_enc if stack == "decoder" else 0) for r in sel]
                ax.plot(xs, [r["grad_norm"] for r in sel], marker=marker, label=f"{stack} {matrix}")
        ax.set_title(f"{NORM_NAMES[norm]}: expected gradient at init")
        ax.set_xlabel("layer (encoder, then decoder)")
        ax.set_yscale("log")
    axes[0][0].set_ylabel("||E[grad]||_F")
    axes[0][-1].legend(fontsize=7)
    return fig


def plot_fig3_depth(rows, result):
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    for norm, color in (("post", "C0"), ("pre", "C1")):
        sel = [s for s in result["summary"] if s["norm"] == norm]
        depths = [s["layers"] for s in sel]
        means = np.array([s["mean"] for s in sel])
        ax.errorbar(depths, means, yerr=[s["std"] for s in sel], marker="o", color=color, capsize=3,
                    label=f"{NORM_NAMES[norm]} (slope {result['loglog_slope'][norm]:+.2f})")
        theory = means[0] * (np.array(depths) / depths[0]) ** result["theory_slope"][norm]
        ax.plot(depths, theory, "--", color=color, alpha=0.6, label=f"Theorem 1: L^{result['theory_slope'][norm]:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.set_xlabel("layers (N-N model)")
    ax.set_ylabel("||grad W^2 of the last FFN||_F")
    ax.set_title("Figure 3(c, d)")
    ax.legend(fontsize=7)
    return fig


def plot_lemma2(rows, result):
    fig, ax = plt.subplots(figsize=(4.8, 3.6))
    post = [r for r in rows if r["norm"] == "post"]
    pre = [r for r in rows if r["norm"] == "pre"]
    ax.plot([r["layer"] for r in post], [r["measured"] for r in post], "o-", label="Post-LN x^{post,5}")
    ax.plot([r["layer"] for r in post], [r["theory"] for r in post], "--", color="C0", alpha=0.6, label="theory")
    ax.plot([r["layer"] for r in pre], [r["measured"] for r in pre], "s-", label="Pre-LN x^{pre}_l")
    ax.fill_between([r["layer"] for r in pre], [r["lower"] for r in pre], [r["upper"] for r in pre], color="C1",
                    alpha=0.15, label="Lemma 2 bounds")
    ax.set_xlabel("layer l")
    ax.set_ylabel("E||x||^2 / d")
    ax.set_title("Lemma 2" + (" (simplified setting)" if result["simplified"] else ""))
    ax.legend(fontsize=7)
    return fig


def plot_deepnet(rows, result):
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, optimizer in zip(axes, ("sgd", "adam")):
        keys = list(dict.fromkeys((r["norm"], r["rule"]) for r in rows))
        for norm, rule in keys:
            sel = [r for r in rows if r["norm"] == norm and r["rule"] == rule and r["optimizer"] == optimizer]
            ax.plot([r["layers"] for r in sel], [r["relative_update"] for r in sel], "o-",
                    label=NORM_NAMES[norm] + (f" ({rule} constants)" if rule else ""))
        depths = sorted({r["layers"] for r in rows})
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(depths, [str(d) for d in depths])
        ax.minorticks_off()
        ax.set_xlabel("layers (encoder-only)")
        ax.set_title(f"one {'SGD' if optimizer == 'sgd' else 'Adam'} step, lr {result['lr']:g}")
    axes[0].set_ylabel("||F(theta*) - F(theta)|| / ||F(theta)||")
    axes[1].legend(fontsize=7)
    return fig
