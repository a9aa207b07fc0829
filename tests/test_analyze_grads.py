"""analyze_grads.py: the gradient function, Lemma 2, the directions of Figure 3(c, d) and DeepNet, the CLI."""

import json
import os

import numpy as np
import pytest
from conftest import tiny_translation, to_numpy

import analyze_grads
from harness import grads_job
from models import LabelSmoothedCrossEntropy


def args_for(*argv):
    args = analyze_grads.parse_args(list(argv))
    return args


def test_gradients_agree_with_finite_differences():
    model = tiny_translation("pre", vocab_size=23, d_model=8, ffn_dim=16, encoder_layers=1, decoder_layers=1)
    rng = np.random.default_rng(0)
    inputs = {"source_ids": rng.integers(3, 23, (2, 5)), "decoder_input_ids": rng.integers(3, 23, (2, 4))}
    labels = rng.integers(3, 23, (2, 4))
    model(inputs)
    loss = LabelSmoothedCrossEntropy(0.1)
    value, grads = grads_job.loss_and_gradients(model, loss, inputs, labels)
    assert value == pytest.approx(float(to_numpy(loss(labels, model(inputs)))), rel=1e-5)
    theta = [to_numpy(v).astype("float64") for v in model.trainable_variables]
    for trial in range(3):  # directional derivatives along random directions
        direction = [rng.standard_normal(t.shape) for t in theta]
        scale = np.sqrt(sum((d**2).sum() for d in direction))
        direction = [d / scale for d in direction]  # a unit step in parameter space
        h = 1e-2
        values = []
        for sign in (1, -1):
            for v, t, d in zip(model.trainable_variables, theta, direction):
                v.assign((t + sign * h * d).astype("float32"))
            values.append(float(to_numpy(loss(labels, model(inputs)))))
        numeric = (values[0] - values[1]) / (2 * h)
        analytic = sum(float((g * d).sum()) for g, d in zip(grads, direction))
        assert numeric == pytest.approx(analytic, rel=2e-2, abs=1e-4), trial
    for v, t in zip(model.trainable_variables, theta):
        v.assign(t.astype("float32"))


def test_lemma2_in_the_simplified_setting(tmp_path):
    args = args_for("lemma2", "--preset", "tiny", "--simplified", "--d-model", "64", "--layers", "6",
                    "--seeds", "4", "--max-tokens", "512", "--length", "16", "--out", str(tmp_path))
    result = grads_job.run_lemma2(args.model, args.data, args.out, args.layers, args.seeds, args.seed, args.simplified)
    assert result["post_theory"] == pytest.approx(1.5)
    assert abs(result["post_mean"] / 1.5 - 1) < 0.10
    pre = [r for r in result["rows"] if r["norm"] == "pre"]
    assert len(pre) == 7 and pre[0]["measured"] == pytest.approx(1.0, rel=0.05)
    for row in pre[1:]:  # (1 + l/2) <= E||x_l||^2 / d <= (1 + 3l/2), with the measured input scale
        assert row["lower"] <= row["measured"] <= row["upper"], row


def test_figure3_depth_directions(tmp_path):
    """Averaged over 3 seeds: Post-LN's last-FFN gradient does not shrink from 2 to 8 layers; Pre-LN's does."""
    args = args_for("fig3-depth", "--preset", "tiny", "--depths", "2,8", "--seeds", "3", "--random-tokens",
                    "--vocab-size", "200", "--out", str(tmp_path))
    result = grads_job.run_fig3_depth(args.model, args.data, args.part("loss"), args.out, args.depths, args.seeds,
                                      args.batches, args.seed)
    mean = {(s["norm"], s["layers"]): s["mean"] for s in result["summary"]}
    assert mean[("post", 8)] >= 0.9 * mean[("post", 2)], mean
    assert mean[("pre", 8)] < 0.8 * mean[("pre", 2)], mean
    assert result["loglog_slope"]["pre"] < result["loglog_slope"]["post"]


def test_deepnet_update_grows_faster_for_post_ln(tmp_path):
    args = args_for("deepnet", "--preset", "tiny", "--deepnet-depths", "2,16", "--random-tokens",
                    "--vocab-size", "200", "--lr", "1e-3", "--out", str(tmp_path))
    result = grads_job.run_deepnet(args.model, args.data, args.part("loss"), args.out, args.deepnet_depths, args.lr,
                                   args.seed)
    growth = result["growth_last_over_first_depth"]
    assert growth["post/adam"] > growth["deepnorm-paper/adam"], growth
    assert all(np.isfinite(r["relative_update"]) and r["relative_update"] > 0 for r in result["rows"])


def test_smoke_run_writes_csv_json_png(tmp_path, capsys):
    out = tmp_path / "analysis"
    code = analyze_grads.cli(["--preset", "tiny", "--random-tokens", "--vocab-size", "120", "--out", str(out)])
    assert code == 0
    for name in ("fig3-layers", "fig3-depth", "lemma2", "lemma2-simplified", "after-warmup", "deepnet-update"):
        for ext in ("csv", "json", "png"):
            path = out / f"{name}.{ext}"
            assert path.is_file() and path.stat().st_size > 0, path
    summary = json.loads((out / "summary.json").read_text())
    assert {"claim", "measured", "theory", "agrees"} <= set(summary[0])
    printed = capsys.readouterr().out
    assert "claim" in printed and "agrees" in printed
    assert not [p for p in os.listdir(out) if ".tmp" in p]  # written atomically


@pytest.mark.parametrize("argv, message", [
    (["--norms", "post,middle"], "--norms: unknown placement middle"),
    (["--lr", "-1"], "--lr must be positive"),
    (["--seeds", "0"], "--seeds must be a positive integer"),
    (["--d-model", "30", "--heads", "4"], "must be divisible by --heads"),
    (["--data-dir", "/nonexistent/dir"], "not a directory"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, message, tmp_path, capsys):
    code = analyze_grads.cli(["fig3-layers", "--preset", "tiny", "--out", str(tmp_path / "o"), *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_unwritable_output_directory(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = analyze_grads.cli(["lemma2", "--preset", "tiny", "--out", str(blocker / "sub")])
    assert code == 2 and "cannot write there" in capsys.readouterr().err


def test_bad_list_argument_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        analyze_grads.parse_args(["--depths", "6,eight"])
    assert exit_info.value.code == 2
    assert "is not a comma-separated list of positive integers" in capsys.readouterr().err


def test_summary_says_yes_only_within_the_stated_tolerances():
    def verdicts(results):
        return [row[3] for row in grads_job.summary_rows(results)]

    # Theorem 1 at the depths measured: Pre-LN's slope between -0.42 and -0.33 over depths 2-8 (Lemma 2's bounds)
    finite = {"post": [0.0, 0.0], "pre": grads_job.finite_depth_slopes([2, 4, 6, 8])}
    assert finite["pre"] == pytest.approx([-0.424, -0.328], abs=1e-3)

    def depth(post, pre):
        return {"fig3-depth": {"loglog_slope": {"post": post, "pre": pre}, "finite_depth_slope": finite}}

    assert verdicts(depth(0.05, -0.45)) == ["yes", "yes"]
    assert verdicts(depth(0.05, -0.25)) == ["yes", "yes"]  # 0.08 above the range's top: within 0.1
    assert verdicts(depth(0.12, -0.2)) == ["in direction"] * 2  # 0.13 above it: only the sign agrees
    assert verdicts(depth(0.9, 0.2)) == ["NO", "NO"]
    assert verdicts({"deepnet": {"growth_last_over_first_depth": {"post/adam": 6.2, "deepnorm-paper/adam": 2.4}}}) \
        == ["in direction"]
    assert verdicts({"deepnet": {"growth_last_over_first_depth": {"post/adam": 6.2, "deepnorm-paper/adam": 1.02}}}) \
        == ["yes"]
