"""analyze_grads.py's outputs: each analysis's rows as CSV, its result as JSON, and its figure.

    write_outputs(args, "fig3-depth", rows, result, plot_fig3_depth)   # fig3-depth.{csv,json,png} in --out
"""

import os

import matplotlib
import numpy as np

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

from cli import NORM_NAMES  # noqa: E402
from runs import write_csv, write_json  # noqa: E402

def write_outputs(args, name, rows, result, plot):
    """NAME.csv (the rows), NAME.json (the result) and NAME.png (`plot(rows, result)`) in --out."""
    base = os.path.join(args.out, name)
    write_csv(base + ".csv", rows)
    write_json(base + ".json", result)
    fig = plot(rows, result)
    fig.tight_layout()
    fig.savefig(base + ".tmp.png", dpi=110)
    os.replace(base + ".tmp.png", base + ".png")
    plt.close(fig)


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
