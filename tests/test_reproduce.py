"""A run's spec (harness/specs.py), the experiments as data (reproduction/experiments.py) and reproduce.py: the
specs are built once and never change; each experiment's runs are the settings its results were measured
with; the plan adds up recorded times; --smoke runs every experiment's pipeline, and a reproduction killed
on its way goes on without redoing finished runs."""

import dataclasses
import json
import math
import os
import shutil
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import once, wait_for

import analyze_grads
import pretrain_bert
import reproduce
import train_nmt
from harness import plots
from reproduction import campaign as reproduction, experiments, runner, tables
from harness.console import UsageError
from harness.files import read_csv
from harness.specs import BertSpec, TranslationSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")
only_jax = once("process handling and files")


class Threads(runner.Threads):
    """A stand-in for harness/runner.Engine in the tests of the reproduction's own logic (stages, publishing,
    resuming, --hours): each task runs `fake(task)` on a thread of this process, `slots` at a time, as Ray
    would run its process; a UsageError is a run that exits with an error. tests/test_ray.py runs the real
    engine."""

    def __init__(self, fake, slots=2):
        super().__init__(self.outcome, slots)
        self.fake, self.live = fake, False

    def announce(self, task):
        runner.announce(task, self.live)

    def outcome(self, task):
        resumed = bool(task.resume) and reproduction.RunDir(task.run_dir).holds_run()
        os.makedirs(task.run_dir, exist_ok=True)
        reproduction.RunDir(task.run_dir).add_placement(dict(host="here", resumed=resumed))
        start = time.time()
        try:
            self.fake(task)
            code = 0
        except UsageError:
            code = 1
        return dict(code=code, seconds=time.time() - start, resumed=resumed, placement=dict(host="here"))


# --- specs ---------------------------------------------------------------------------------------------

def test_a_spec_is_frozen_and_decides_its_schedule_once():
    spec = train_nmt.parse_args(["--norm", "pre", "--no-warmup"])
    assert (spec.schedule, spec.decay_factor, spec.given) == ("step", 0.1, frozenset({"norm", "no_warmup"}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.lr = 1.0
    wmt = spec.but(preset="wmt14")  # derived values decided again; the spec itself unchanged
    assert (wmt.schedule, wmt.decay_factor, wmt.d_model, spec.schedule) == ("decay_then_inverse_sqrt", 1.0, 512, "step")
    assert dataclasses.replace(spec, preset="wmt14").schedule == "step"  # why `but`, not replace
    assert TranslationSpec.build(**spec.flags()) == spec
    with pytest.raises(TypeError, match="has no field colour"):
        spec.but(colour="red")


def test_given_flags_count_a_default_given_on_the_command_line():
    assert train_nmt.parse_args(["--seed", "1", "--beam", "5"]).given == {"seed", "beam"}
    assert train_nmt.parse_args([]).given == frozenset()
    bert = pretrain_bert.parse_args(["--recipe", "pre-no-warmup", "--warmup-steps", "7"])
    assert (bert.norm, bert.no_warmup, bert.given) == ("pre", False, {"recipe", "warmup_steps"})
    analysis = analyze_grads.parse_args(["--norms", "post, pre", "--preset", "tiny"])
    assert analysis.norms == ("post", "pre") and analysis.depths == (1, 2)


def test_the_parsers_defaults_are_the_specs():
    """One source of defaults: what argparse fills in when a flag is absent is the spec's own value."""
    for module, spec in ((train_nmt, train_nmt.parse_args([])), (pretrain_bert, pretrain_bert.parse_args([])),
                         (analyze_grads, analyze_grads.parse_args([]))):
        parsed = vars(module.build_parser().parse_args([]))
        differ = {k: (v, getattr(spec, k)) for k, v in parsed.items() if v is not None and hasattr(spec, k)
                  and getattr(spec, k) != v}
        assert differ == {}, module.__name__


def test_config_json_holds_every_field_and_what_was_given(tmp_path):
    from harness.rundir import RunDir

    spec = train_nmt.parse_args(["--norm", "deepnorm", "--lr", "5e-4"])
    run_dir = RunDir.start(str(tmp_path / "run"), resume=False)
    run_dir.write_config(spec.config(), dict(data="x"))
    config = run_dir.config()
    assert config["norm"] == "deepnorm" and config["given"] == ["lr", "norm"] and config["data"] == "x"
    assert config["code_version"]["fingerprint"] and set(spec.config()) <= set(config)


# --- experiments ---------------------------------------------------------------------------------------

def recorded(experiment, run):
    """The results.json of a run as results/ holds it."""
    folder = os.path.join(RESULTS, experiment.folder)
    name = "results.json" if experiment.name == "main" else f"{run}.json"
    with open(os.path.join(folder, name), encoding="utf-8") as f:
        return json.load(f)


# The rows of the Results table that read each translation experiment's folder.
LABELS = {"fig2": ("Fig 2 (Sec 3)", "Fig 2(c, d)"), "fig4": ("Fig 4 (Sec 4)", "Fig 4", "Sec 4, Fig 4"),
          "depth": ("DeepNet (Fig 1, Table 1)",)}


@pytest.mark.parametrize("name", ["main", "fig2", "fig4", "depth"])
def test_each_translation_experiment_runs_what_its_results_were_measured_with(name):
    """`--sweep NAME` with no other flag runs the experiment's first stage, and every run in results/NAME
    is one of the experiment's runs with its settings; a folder not yet measured under its protocol has
    every row that reads it marked stale."""
    experiment = experiments.EXPERIMENTS[name]
    if name == "main":
        assert [run.spec for run in experiment.runs] == [train_nmt.parse_args(["--norm", "pre", "--no-warmup"])]
        published = {"main": recorded(experiment, "main")}
    else:
        sweep = [run.spec for run in experiments.sweep_runs(name, train_nmt.parse_args([]))]
        assert [run.spec for run in experiment.runs] == sweep[:len(experiment.runs)]
        listing = os.path.join(RESULTS, name, f"runs-{name}.csv")
        if not os.path.exists(listing):
            rows = [row for row in tables.results_rows(ROOT) if row.label in LABELS[name]]
            assert rows and all(row.stale for row in rows), [row.claim for row in rows if not row.stale]
            return
        published = {r["run"]: recorded(experiment, r["run"]) for r in read_csv(listing)}
    runs = {run.name: run.spec for run in experiment.all_runs(published)}
    assert set(published) <= set(runs)  # every stage that the results call for (and runs the protocol added since)
    for name_, result in published.items():
        spec = runs[name_]
        assert (result["norm"], result["layers"], result["lr"], result["optimizer"]) == (
            spec.norm, [spec.encoder_layers, spec.decoder_layers], spec.lr, spec.optimizer), name_
        assert (result["warmup"], result["schedule"], result["test_beam"]) == (
            not spec.no_warmup, spec.schedule, spec.beam), name_
        epochs = result["updates"] / max(1, result["epochs"])
        assert result["epochs"] == spec.epochs and 240 <= epochs <= 260, name_  # 256 packed updates an epoch
    if name == "main":  # every setting config.json recorded, but where it lives and the objects it serialised
        with open(os.path.join(RESULTS, "main", "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        spec = experiment.runs[0].spec.config()
        skip = {"out", "resume", "given", "schedule", "batching", "test_sentences"}
        assert {k: (v, config[k]) for k, v in spec.items() if k in config and k not in skip and config[k] != v} == {}


def ended(runs, center=1e-3, **changes):
    """Made-up results.json of ended runs, with `changes[name]` on top: the final validation loss is lowest at
    rate `center` (3.0) and grows with the distance from it (0.1 a factor of 2)."""
    return {run.name: {**dict(final_valid_loss=3.0 + 0.1 * abs(math.log2(run.spec.lr / center)), outcome="finished",
                              test_tokenized_bleu=20.0), **changes.get(run.name, {})} for run in runs}


def test_fig4_tunes_each_arm_then_runs_its_other_seeds_at_the_chosen_rate():
    fig4 = experiments.EXPERIMENTS["fig4"]
    assert len(fig4.runs) == 15 and {run.spec.seed for run in fig4.runs} == {1}
    specs = {run.name: run.spec for run in fig4.runs}
    assert {(s.eval_every, s.epochs, s.encoder_layers) for s in specs.values()} == {(32, 3, 4)}
    warm, cold = specs["post-adam-warmup-lr1e-3"], specs["post-adam-nowarmup-lr1e-3"]
    assert (warm.schedule, warm.warmup_steps, warm.no_warmup) == ("inverse_sqrt", 300, False)
    assert (cold.schedule, cold.no_warmup, cold.optimizer) == ("linear", True, "adam")
    assert specs["post-radam-lr1e-3"].config() == cold.but(optimizer="radam").config()
    assert specs["pre-adam-nowarmup-lr1e-3"].schedule == "step" and specs["pre-radam-lr2e-3"].optimizer == "radam"
    early = fig4.all_runs(ended(fig4.runs[:14]))[15:]  # pre-radam's grid has not ended: no seeds of it yet
    assert len(early) == 8 and not [run for run in early if run.name.startswith("pre-radam")]
    # post-radam's lowest loss is at 2e-3, the grid's edge: it runs 4e-3 first. post-adam-warmup's lowest at 5e-4
    # diverged, so its best is 1e-3; the rest are lowest at 1e-3.
    changes = {"post-radam-lr2e-3": dict(final_valid_loss=2.5),
               "post-adam-warmup-lr5e-4": dict(final_valid_loss=1.0, outcome="diverged")}
    later = [run.name for run in fig4.all_runs(ended(fig4.runs, **changes))[15:]]
    assert later == [f"{arm}-lr1e-3-seed{seed}" for arm in ("post-adam-warmup", "post-adam-nowarmup")
                     for seed in (2, 3)] + ["post-radam-lr4e-3"] + [
        f"{arm}-lr1e-3-seed{seed}" for arm in ("pre-adam-nowarmup", "pre-radam") for seed in (2, 3)]
    widened = [run for run in fig4.all_runs(ended(fig4.runs)) if run.name == "post-radam-lr4e-3"]
    changes["post-radam-lr4e-3"] = dict(final_valid_loss=2.7)  # worse than 2e-3: the best is inside, seeds at 2e-3
    later = [run.name for run in fig4.all_runs(ended(fig4.runs + tuple(
        fig4.all_runs(ended(fig4.runs, **changes))[15:]), **changes))[15:]]
    assert "post-radam-lr2e-3-seed2" in later and "post-radam-lr4e-3" in later and len(later) == len(fig4.assumed_runs()) - 15 + 1
    assert not widened  # with the lowest loss inside every grid, nothing is added


def test_the_edge_rule_widens_a_grid_until_its_best_is_inside():
    arm = experiments.Arm("a", TranslationSpec.build(), (5e-4, 1e-3, 2e-3))
    runs = {run.name: run for lr in (1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2)
            for run in [arm.run(lr)]}
    assert arm.widened(ended(arm.grid(), center=1e-3)) == ([5e-4, 1e-3, 2e-3], 1e-3)
    assert arm.widened(ended(arm.grid(), center=2e-2)) == ([5e-4, 1e-3, 2e-3, 4e-3], None)  # waits for 4e-3
    assert arm.widened(ended(runs.values(), center=2e-2)) == ([5e-4, 1e-3, 2e-3, 4e-3, 8e-3, 1.6e-2], 1.6e-2)  # 3 at most
    assert arm.widened(ended(runs.values(), center=1e-5)) == ([6.25e-5, 1.25e-4, 2.5e-4, 5e-4, 1e-3, 2e-3], None)
    diverged = ended(runs.values(), center=2e-2, **{"a-lr4e-3": dict(outcome="diverged")})
    assert arm.widened(diverged) == ([5e-4, 1e-3, 2e-3, 4e-3], 2e-3)  # a rate that diverges ends the climb
    # a results.json and a results table's row are read alike: diverged, missing ("", None) or nan lose
    assert [experiments.final_loss(r) for r in ({"final_valid_loss": 3.5}, {"final_valid_loss": "3.5"})] == [3.5, 3.5]
    assert {experiments.final_loss(r) for r in (None, {}, {"final_valid_loss": ""}, {"final_valid_loss": "nan"},
                                                {"final_valid_loss": 3.0, "outcome": "diverged"})} == {float("inf")}


def test_premises_come_first_fig2_sgd_and_depth():
    fig2 = experiments.EXPERIMENTS["fig2"]
    sgd = [run for run in fig2.runs if "sgd" in run.name]
    first = len(fig2.runs)  # Adam: 4 arms at 2 rates, 3 seeds each; SGD's grid
    assert [run.spec.lr for run in sgd] == [0.01, 0.03, 0.1, 0.3] and first == 4 * 2 * 3 + 4
    low = {run.name: dict(test_tokenized_bleu=4.0) for run in sgd}
    assert fig2.all_runs(ended(fig2.runs, **low)) == fig2.runs  # no rate trains: not testable, nothing more
    low["post-sgd-warmup-lr3e-1"] = dict(test_tokenized_bleu=12.0, final_valid_loss=3.5)
    low["post-sgd-warmup-lr1e-1"] = dict(test_tokenized_bleu=11.0, final_valid_loss=3.4)
    later = fig2.all_runs(ended(fig2.runs, **low))[first:]
    assert [run.name for run in later] == [
        "post-sgd-nowarmup-lr1e-1", "post-sgd-nowarmup-lr2e-1", "post-sgd-warmup-lr1e-1-seed2",
        "post-sgd-nowarmup-lr1e-1-seed2", "post-sgd-warmup-lr1e-1-seed3", "post-sgd-nowarmup-lr1e-1-seed3"]
    assert later[0].spec.no_warmup and later[0].spec.schedule == "constant" and len(later) == len(fig2.assumed_runs()) - first
    depth = experiments.EXPERIMENTS["depth"]
    assert [run.name for run in depth.runs] == ["post-6L-lr2.5e-4", "post-6L-lr5e-4", "post-6L-lr1e-3"]
    assert {(r.spec.schedule, r.spec.warmup_steps, r.spec.epochs) for r in depth.runs} == {("inverse_sqrt", 256, 4)}
    failing = {run.name: dict(test_tokenized_bleu=14.9) for run in depth.runs}
    assert depth.all_runs(ended(depth.runs, 5e-4, **failing)) == depth.runs
    grid = depth.all_runs(ended(depth.runs, 5e-4))
    assert len(grid) == 3 + 2 + 15  # the premise holds: its seeds, every (placement, depth) at 3 rates
    everything = depth.all_runs(ended(grid, 5e-4))
    assert everything == depth.assumed_runs() and len(everything) == 36
    beside = {run.name: run.spec for run in everything if "torchscale" in run.name}
    assert sorted(beside) == sorted(f"deepnorm-torchscale-{d}L-lr5e-4{s}" for d in (6, 12) for s in ("", "-seed2",
                                                                                                         "-seed3"))
    assert {spec.deepnorm_rule for spec in beside.values()} == {"torchscale"}


def test_fig5_tunes_both_recipes_then_runs_seeds_2_and_3_at_their_rates():
    fig5 = experiments.EXPERIMENTS["fig5"]
    specs = {run.name: run.spec for run in fig5.runs}
    assert len(specs) == 8 and {(s.steps, s.norm, s.no_warmup, s.warmup_steps) for s in specs.values()} == {
        (1000, "post", False, 100), (1000, "pre", True, 100)}
    assert specs["pre-no-warmup-lr3e-4"].lr == 3e-4 and isinstance(specs["post-warmup-lr1e-4"], BertSpec)
    results = ended(fig5.runs, 3e-4)
    assert fig5.final(results) == ("post-warmup-lr3e-4", "pre-no-warmup-lr3e-4")
    assert fig5.all_runs({}) == fig5.runs  # the grids first
    # then seeds 2 and 3 at each recipe's chosen rate, whatever the ratio (protocols 2026-11-29, 4): no curve is read
    more = fig5.all_runs(results)[len(fig5.runs):]
    assert [run.name for run in more] == ["post-warmup-lr3e-4-seed2", "post-warmup-lr3e-4-seed3",
                                          "pre-no-warmup-lr3e-4-seed2", "pre-no-warmup-lr3e-4-seed3"]
    assert len(fig5.assumed_runs()) == 12


def test_the_converged_protocol_trains_the_chosen_runs_to_their_plateau():
    """results/protocols.md, 2026-12-02: Figures 2, 4 and 5(a) on the CPU, each experiment's runs at its chosen
    rates (Figure 2: its three Adam arms at both rates), 3 seeds, validated every 128 updates (BERT: 50) and
    stopped at the plateau (10 validations without 0.01 nats), within one cap for every arm; seed 1 of every arm
    first. DeepNet's depth keeps the protocol for bigger hardware (2026-11-29, 9), run only by name."""
    for name, arms in (("fig2", experiments.FIG2_CONVERGED_ARMS), ("fig4", None), ("fig5", None)):
        converged = experiments.EXPERIMENTS[f"{name}-converged"]
        listed = read_csv(os.path.join(RESULTS, name, f"runs-{name}.csv"))
        seeded = {(row["arm"], float(row["lr"])) for row in listed if int(row["seed"]) > 1
                  and (arms is None or row["arm"] in arms)}
        cpu = {run.name: run.spec for run in experiments.EXPERIMENTS[name].all_runs(experiments.published(name))}
        assert {(run.recipe, run.spec.lr) for run in converged.runs} == seeded
        assert len(converged.runs) == 3 * len(seeded) and converged.each and converged.hardware == "cpu"
        assert [run.spec.seed for run in converged.runs] == sorted(run.spec.seed for run in converged.runs)
        for run in converged.runs:
            if name == "fig5":
                assert run.spec == cpu[run.name].but(steps=4000, eval_every=50, patience=10, min_delta=0.01), run.name
            else:
                step = {"decay_epoch": 8} if run.spec.schedule == "step" else {}  # the paper's epoch (2026-12-06)
                assert run.spec == cpu[run.name].but(epochs=24, eval_every=128, patience=10, min_delta=0.01, **step)
                assert experiments.ends_at_the_cap(run.spec) == (run.spec.schedule == "linear")
        assert converged in reproduce.selected(None, False)
    assert len(experiments.EXPERIMENTS["fig2-converged"].runs) == 18
    assert len(experiments.EXPERIMENTS["fig4-converged"].runs) == 15
    depth = experiments.EXPERIMENTS["depth-converged"]
    assert depth.hardware == "gpu" and depth not in reproduce.selected(None, False)
    assert all(run.spec.patience == 5 and run.spec.eval_every == 0 for run in depth.runs)
    assert [e.name for e in reproduce.selected("depth-converged", False)] == ["depth-converged"]


def test_the_converged_campaign_counts_each_run_at_its_cap_as_its_ended_runs_took(tmp_path):
    """results/protocols.md, 2026-12-02, 7, and 2026-12-07: `--plan` counts each converged run at its cap, the
    measured run's time stretched to it, until the converged run itself has ended and recorded its own time;
    the stretch is scaled by what the experiment's ended runs took over their own stretches (on the host of
    fig2-converged's runs, about twice: a converged run also validates every 128 updates)."""
    fig2, fig4 = experiments.EXPERIMENTS["fig2-converged"], experiments.EXPERIMENTS["fig4-converged"]
    short = reproduction.read_timing(experiments.EXPERIMENTS["fig2"], RESULTS)
    first, second = fig2.runs[0].name, fig2.runs[1].name
    (tmp_path / "fig2").mkdir()
    (tmp_path / "fig2-converged").mkdir()
    shutil.copy(os.path.join(RESULTS, "fig2", reproduction.TIMING), tmp_path / "fig2")
    (tmp_path / "fig2-converged" / reproduction.TIMING).write_text(json.dumps({  # 3x and 1x their stretches
        first: dict(wall_s=short[first]["wall_s"] * 4.8 * 3), second: dict(wall_s=short[second]["wall_s"] * 4.8)}))
    scale = (3 * short[first]["wall_s"] + short[second]["wall_s"]) / (short[first]["wall_s"] + short[second]["wall_s"])
    for run in fig2.runs[1:]:
        expected = short[run.name]["wall_s"] * 4.8 / 60 * (1 if run.name == second else scale)
        assert reproduction.run_minutes(fig2, run, str(tmp_path)) == pytest.approx(expected), run.name
    (_, runs, minutes, source), = reproduction.make_plan([fig2], 2, str(tmp_path))
    assert runs == 18 and minutes == pytest.approx(sum(reproduction.run_minutes(fig2, r, str(tmp_path)) for r in fig2.runs))
    assert source == f"fig2/timing.json: the same runs at 4.8x the updates, times {scale:.2f} as its 2 recorded runs took"
    fig4_short = reproduction.read_timing(experiments.EXPERIMENTS["fig4"], RESULTS)
    (tmp_path / "fig4").mkdir()
    shutil.copy(os.path.join(RESULTS, "fig4", reproduction.TIMING), tmp_path / "fig4")
    for run in fig4.runs:  # none of its own recorded: the stretch alone
        assert reproduction.run_minutes(fig4, run, str(tmp_path)) == pytest.approx(fig4_short[run.name]["wall_s"] / 60 * 8)


def test_a_converged_run_is_published_as_it_ends_and_taken_back_next_time(tmp_path, monkeypatch):
    """results/protocols.md, 2026-12-02, 7: each converged run goes into results/FOLDER as it ends (RUN.json,
    RUN.csv, its row of runs-NAME.csv, and curves-NAME.png redrawn with every run ended so far, each to where
    it stopped), and a later start puts it back instead of running it again, a run stopped at its plateau short
    of the cap included; a run published with other settings runs again."""
    drawn = {}
    monkeypatch.setattr(reproduction, "plot_panels", lambda path, x, panels: drawn.update({os.path.basename(path): panels}))
    fig4 = experiments.EXPERIMENTS["fig4-converged"]
    out, results = tmp_path / "runs" / "fig4-converged", tmp_path / "results"
    for run, plateau in zip(fig4.runs[:2], (3328, None)):
        folder = out / run.name
        folder.mkdir(parents=True)
        spec = run.spec
        result = dict(run=spec.name(), outcome="finished", epochs=13 if plateau else 24, updates=plateau or 6144,
                      layers=[spec.encoder_layers, spec.decoder_layers], plateau_at=plateau, final_valid_loss=3.0,
                      test_tokenized_bleu=30.0, code_version=dict(fingerprint=reproduction.code_version()["fingerprint"]))
        (folder / "results.json").write_text(json.dumps(result))
        (folder / "metrics.csv").write_text("epoch,updates,valid_loss,valid_bleu\n1,64,,\n1,128,5.0,1.5\n"
                                            f"2,256,{4.0 if plateau else 'nan'},2.5\n")
    reproduction.publish_run(fig4, fig4.runs[1], str(out), str(results))
    (loss, lines), _ = drawn["curves-fig4-converged.png"]
    assert loss.endswith("the 1 run ended") and lines == {
        f"{fig4.runs[1].recipe}, lr {fig4.runs[1].spec.lr:g}, seed {fig4.runs[1].spec.seed}": ([128], [5.0], None)}
    reproduction.publish_run(fig4, fig4.runs[0], str(out), str(results))
    (loss, lines), (bleu, points) = drawn["curves-fig4-converged.png"]
    assert loss.endswith("the 2 runs ended") and list(lines.values())[0] == ([128, 256], [5.0, 4.0], None)
    assert list(points.values()) == [([128, 256], [1.5, 2.5], None)] * 2  # a diverged validation loss (nan): no point
    listed = read_csv(str(results / "fig4-converged" / "runs-fig4-converged.csv"))
    assert [row["run"] for row in listed] == [run.name for run in fig4.runs[:2]]  # in the experiment's order
    assert (results / "fig4-converged" / f"{fig4.runs[0].name}.csv").read_text().startswith("epoch,updates")
    again = tmp_path / "again"
    assert reproduction.restore_published(fig4, str(again), str(results)) == [run.name for run in fig4.runs[:2]]
    assert set(reproduction.ended_results(fig4, str(again))) == {run.name for run in fig4.runs[:2]}
    other = dataclasses.replace(fig4, runs=tuple(dataclasses.replace(run, spec=run.spec.but(epochs=30))
                                                 for run in fig4.runs))  # another cap: every run runs again
    assert reproduction.restore_published(other, str(tmp_path / "other"), str(results)) == []


def test_fig4_long_runs_figure_4s_arms_at_twice_the_updates():
    long = experiments.EXPERIMENTS["fig4-long"]  # Figure 4 at twice its budget (2026-11-29, 2)
    assert {run.spec.epochs for run in long.runs} == {6} and len(long.runs) == 15
    assert {(r.recipe, r.spec.lr) for r in long.runs} == {
        (arm, lr) for arm, lr in {(row["arm"], float(row["lr"])) for row in read_csv(
            os.path.join(RESULTS, "fig4", "runs-fig4.csv")) if int(row["seed"]) > 1}}


def test_published_runs_of_code_that_gives_todays_numbers_are_not_run_again(tmp_path, monkeypatch):
    """A protocol that grows (Figure 2's second rate and seeds) runs only its new runs: the runs results/
    publishes are put back where their code gives today's numbers and the experiment still runs them so."""
    fig2 = experiments.EXPERIMENTS["fig2"]
    monkeypatch.setattr(reproduction, "same_numbers", lambda found, job: True)
    put_back = reproduction.restore_published(fig2, str(tmp_path / "fig2"), RESULTS)
    listed = [row["run"] for row in read_csv(os.path.join(RESULTS, "fig2", "runs-fig2.csv"))]
    assert sorted(put_back) == sorted(listed)
    assert set(reproduction.ended_results(fig2, str(tmp_path / "fig2"))) == set(listed)
    assert len(fig2.runs) == 24 + 4  # Adam: 4 arms x 2 rates x 3 seeds; SGD's grid
    monkeypatch.setattr(reproduction, "same_numbers", lambda found, job: False)  # other code: all run again
    assert reproduction.restore_published(fig2, str(tmp_path / "other"), RESULTS) == []
    changed = dataclasses.replace(fig2, follow=fig2.follow, runs=tuple(
        experiments.Run(run.name, run.spec if "sgd" in run.name else run.spec.but(epochs=6))
        for run in fig2.runs))  # Adam's runs with other settings: run again
    monkeypatch.setattr(reproduction, "same_numbers", lambda found, job: True)
    assert reproduction.restore_published(changed, str(tmp_path / "changed"), RESULTS) == [
        name for name in listed if name.startswith("post-sgd")]


def test_a_run_ended_on_certified_code_is_done_and_bert_runs_still_read_its_vocabulary(tmp_path, monkeypatch):
    fig5 = experiments.EXPERIMENTS["fig5"]
    first = tmp_path / "fig5" / fig5.runs[0].name
    first.mkdir(parents=True)
    (first / "results.json").write_text(json.dumps(dict(outcome="finished", code_version=dict(fingerprint="older"))))
    monkeypatch.setattr(reproduction, "same_numbers", lambda found, job: found == "older")  # certified equivalent
    tasks = reproduction._tasks(fig5, fig5.runs, str(tmp_path / "fig5"), str(tmp_path), None, {"fig5": fig5})
    assert [task.name for task in tasks] == [f"fig5/{run.name}" for run in fig5.runs[1:]]  # not run again
    assert all(task.after == {f"fig5/{first.name}"} and str(first) in " ".join(task.command) for task in tasks)


def test_a_user_flag_reaches_every_run_but_those_it_would_blur():
    base = train_nmt.parse_args(["--epochs", "1", "--norm", "pre", "--seed", "3", "--lr", "0.5"])
    runs = experiments.sweep_runs("depth", base)
    assert {run.spec.epochs for run in runs} == {1} and {run.spec.seed for run in runs} == {3}
    assert [run.spec.norm for run in runs[::3][:3]] == ["post", "pre", "deepnorm"] and len(runs) == 18
    assert {run.spec.lr for run in runs} == set(experiments.DEPTH_RATES)


def test_smoke_experiments_keep_the_stages_but_shrink_them():
    for experiment in experiments.EXPERIMENTS.values():
        small = experiment.smoke()
        assert {r.name for r in small.runs} <= {r.name for r in experiment.runs}
        big = {run.name: run.spec for run in experiment.runs}
        results = {}
        for _ in range(4):  # every stage, whatever the tiny runs give
            results = ended(small.all_runs(results, premises=True))
        runs = small.all_runs(results)
        assert len(runs) > len(small.runs) or not experiment.follow, experiment.name
        for run in runs:
            assert run.spec.preset == "tiny"
            for field in ("norm", "optimizer", "no_warmup", "seed", "recipe", "finetune", "deepnorm_rule"):
                if run.name in big:
                    assert getattr(run.spec, field, None) == getattr(big[run.name], field, None), (run.name, field)


# --- the plan --------------------------------------------------------------------------------------------

def test_plan_lists_every_experiment_with_a_time_and_a_total(capsys):
    assert reproduce.main(["--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    gpu = [name for name, e in experiments.EXPERIMENTS.items() if e.hardware == "gpu"]
    cut = next(i for i, line in enumerate(lines) if line.startswith("on a GPU, run by name"))
    lines, on_gpu = lines[:cut], lines[cut + 1:]
    assert re.fullmatch(r"quick rows first: --only main,analysis, about \d+ min \(.*\)", lines[-1]), lines[-1]
    lines = lines[:-1]
    assert [line.split()[0] for line in lines[1:-1] if not line.startswith("  (")] == [
        name for name in experiments.EXPERIMENTS if name not in gpu]
    # the converged protocol's experiments, each with its cost in GPU-hours from the measured GPU step
    assert [line.split()[0] for line in on_gpu] == gpu == ["depth-converged"]
    assert all(re.search(r"\d runs +\d+\.\d GPU-h .*29\.3 ms a step", line) for line in on_gpu), on_gpu
    total = lines[-1]
    assert total.startswith("  total: about ") and f"with {os.cpu_count()} slots" in total
    hours, minutes = (int(v) for v in total.split("about ")[1].split(" with")[0].replace(" h ", " ").split())
    assert 60 <= 60 * hours + minutes
    over = [line for line in lines if line.startswith("  (more than an afternoon's 4 hours")]
    assert bool(over) == (60 * hours + minutes > reproduction.AFTERNOON)  # the plan says when it is more
    # named by --only, an experiment sized for GPUs shows its GPU-hours beside its hours on these cores
    assert reproduce.main(["--plan", "--only", "main,depth-converged"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\n  depth-converged +24 runs +\d+\.\d GPU-h ", out) and "quick rows first" not in out
    assert reproduce.main(["--plan", "--only", "main"]) == 0
    assert "on a GPU" not in capsys.readouterr().out


def test_plan_prefers_the_times_a_reproduction_recorded(tmp_path):
    main, fig4 = experiments.EXPERIMENTS["main"], experiments.EXPERIMENTS["fig4"]
    for name in ("main", "fig4"):
        (tmp_path / name).mkdir()
    (tmp_path / "main" / reproduction.TIMING).write_text(json.dumps({"main": dict(wall_s=600, jobs=2)}))
    (tmp_path / "fig4" / reproduction.TIMING).write_text(json.dumps({  # two runs, one a seed; an old name left out
        "post-radam-lr1e-3": dict(wall_s=600, jobs=2, arm="post-radam", seed=1),
        "pre-radam-lr5e-4-seed3": dict(wall_s=480, jobs=2, arm="pre-radam", seed=3),
        "post-radam-nowarmup": dict(wall_s=6000, jobs=2)}))
    (_, runs, minutes, source), (_, count, protocol, where) = reproduction.make_plan([main, fig4], 2, str(tmp_path))
    assert (runs, minutes, source) == (1, 10, f"main/{reproduction.TIMING}")
    assert (count, protocol) == (25, 9 * 25)  # 18 minutes for 2 runs of 8 layers: 23 more at 9 minutes each
    assert where == f"fig4/{reproduction.TIMING}: 2 runs recorded, 23 more at their minutes per layer"
    (_, _, minutes, source), = reproduction.make_plan([fig4], 2, str(tmp_path / "nothing"))
    assert minutes == fig4.minutes and source.startswith("a first guess")
    # once published, the runs it held (its grids widened by the edge rule), each at the time it recorded
    (tmp_path / "fig4" / "runs-fig4.csv").write_text("run,arm,lr,seed\npost-radam-lr1e-3,post-radam,0.001,1\n"
                                                     "post-radam-lr2e-3,post-radam,0.002,1\n"
                                                     "pre-radam-lr5e-4-seed3,pre-radam,0.0005,3\n")
    (_, count, protocol, where), = reproduction.make_plan([fig4], 2, str(tmp_path))
    # and the 13 other runs of its first stage that its protocol holds now, at the mean of those (9 minutes)
    assert (count, protocol, where) == (3 + 13, 10 + 8 + 9 + 13 * 9, f"fig4/{reproduction.TIMING}: the 3 runs it "
                                        "published, 13 more that its protocol holds now at their mean")


def test_plan_counts_each_recorded_time_as_recorded(tmp_path):
    """The plan adds up the wall times as the hosts that ran them recorded them (an entry's other fields,
    such as a host speed that older entries hold, change nothing)."""
    main = experiments.EXPERIMENTS["main"]
    (tmp_path / "main").mkdir()
    timing = {"main": dict(wall_s=600, jobs=2, speed=180.0)}
    (tmp_path / "main" / reproduction.TIMING).write_text(json.dumps(timing))
    assert reproduction.make_plan([main], 2, str(tmp_path))[0][2] == 10
    (tmp_path / "main" / reproduction.TIMING).write_text(json.dumps({"main": dict(wall_s=900, jobs=2)}))
    assert reproduction.make_plan([main], 2, str(tmp_path))[0][2] == 15
    assert reproduction.read_timing(main, str(tmp_path)) == {"main": dict(wall_s=900, jobs=2)}


def test_plan_times_deeper_runs_by_their_layers(tmp_path):
    depth = experiments.EXPERIMENTS["depth"]
    (tmp_path / "depth").mkdir()
    (tmp_path / "depth" / reproduction.TIMING).write_text(json.dumps({  # the premise grid, one rate added
        name: dict(wall_s=540, jobs=2, arm="post-6L", seed=1) for name in ("post-6L-lr2.5e-4", "post-6L-lr5e-4",
                                                                            "post-6L-lr1e-3", "post-6L-lr2e-3")}))
    (_, count, minutes, where), = reproduction.make_plan([depth], 2, str(tmp_path))
    six = [run for run in depth.assumed_runs() if run.spec.encoder_layers == 6]
    assert len(six) == 18 and count == 4 + 15 + 18  # at 6 and 12 layers: 3 placements x 5 runs, torchscale's 3
    assert minutes == pytest.approx(4 * 9 + 15 * 9 + 18 * 18)  # 12 layers: twice the minutes
    assert where == f"depth/{reproduction.TIMING}: 4 runs recorded, 33 more at their minutes per layer"


def test_a_run_at_another_rate_stands_in_for_its_arms_assumed_run_of_one_rate(tmp_path):
    """torchscale's arm runs at DeepNorm's chosen rate, not at the grid's middle the plan assumes: its seed 1,
    recorded at 2e-3, is the assumed seed-1 run (5e-4), not one more. A grid's seed 1 at a rate outside the
    grid (the edge rule's) stands in for none of the grid's runs."""
    depth = experiments.EXPERIMENTS["depth"]
    (tmp_path / "depth").mkdir()
    (tmp_path / "depth" / reproduction.TIMING).write_text(json.dumps({
        name: dict(wall_s=540, jobs=2, arm=name[:-len("-lr2e-3")], seed=1)
        for name in ("deepnorm-torchscale-6L-lr2e-3", "post-6L-lr2e-3")}))
    assumed = {run.name for run in depth.assumed_runs()}
    assert "deepnorm-torchscale-6L-lr5e-4" in assumed and len(assumed) == 36
    (_, count, _, where), = reproduction.make_plan([depth], 2, str(tmp_path))
    assert count == 2 + 35 and where == f"depth/{reproduction.TIMING}: 2 runs recorded, 35 more at their minutes per layer"


def test_the_plans_wall_time_waits_for_figure_5s_first_run_then_mrpc():
    fig5, mrpc, fig4 = (experiments.EXPERIMENTS[name] for name in ("fig5", "mrpc", "fig4"))
    # Figure 5(a): its first run alone (the others read its vocabulary), then 7 runs 2 at a time, then MRPC
    assert reproduction.wall_minutes([(fig5, 8, 80.0, ""), (mrpc, 1, 5.0, "")], 2) == 10 * (1 + 4) + 5
    assert reproduction.wall_minutes([(fig5, 8, 80.0, ""), (mrpc, 1, 5.0, ""), (fig4, 30, 300.0, "")], 2) == 192.5


def test_the_plan_of_a_stopped_reproduction_says_what_is_done_and_the_time_left(tmp_path, capsys):
    main, fig4 = experiments.EXPERIMENTS["main"], experiments.EXPERIMENTS["fig4"]
    for name in ("main", "fig4"):
        (tmp_path / "results" / name).mkdir(parents=True)
    (tmp_path / "results" / "main" / reproduction.TIMING).write_text(json.dumps({"main": dict(wall_s=600, jobs=2)}))
    (tmp_path / "results" / "fig4" / reproduction.TIMING).write_text(json.dumps({
        "post-radam-lr1e-3": dict(wall_s=600, jobs=2, arm="post-radam", seed=1),
        "pre-radam-lr5e-4": dict(wall_s=480, jobs=2, arm="pre-radam", seed=1)}))
    today = dict(code_version=dict(fingerprint=reproduction.code_version()["fingerprint"]), outcome="finished")
    for name, fingerprint in (("post-radam-lr1e-3", None), ("pre-radam-lr5e-4", "0123456789ab")):  # one of other code
        run = tmp_path / "runs" / "fig4" / name
        run.mkdir(parents=True)
        (run / "results.json").write_text(json.dumps(dict(today, code_version=dict(
            fingerprint=fingerprint or today["code_version"]["fingerprint"]), final_valid_loss=3.5)))
    plan = reproduction.make_plan([main, fig4], 2, str(tmp_path / "results"))
    left = reproduction.what_is_left(plan, str(tmp_path / "runs"), str(tmp_path / "results"))
    assert left == [(0, 10.0), (1, 9 * 25 - 10)]  # main not run here; fig4's run of today's code took 10 minutes
    reproduction.print_plan(plan, 2, left)
    out = capsys.readouterr().out
    assert "(1 done)" in out and out.strip().endswith("total: about 1 h 58 with 2 slots; 1 run done on today's "
                                                      "code, about 1 h 52 left")  # (10 + 225) / 2, (10 + 215) / 2


def test_the_plans_hours_round_before_they_split():
    assert [reproduction.hours(m) for m in (59.4, 59.6, 359.6, 125.2)] == ["59 min", "1 h 00", "6 h 00", "2 h 05"]


def test_the_plan_says_mrpc_is_skipped_without_its_data_and_leaves_it_out_of_the_total(capsys):
    fig5, mrpc = experiments.EXPERIMENTS["fig5"], experiments.EXPERIMENTS["mrpc"]
    without = reproduction.make_plan([fig5, mrpc], 2, os.path.join(ROOT, "results"))
    assert without[1][2] is None and "--glue-dir" in without[1][3]
    given = reproduction.make_plan([fig5, mrpc], 2, os.path.join(ROOT, "results"), glue_dir="MRPC")
    assert given[1][2] > 0 and reproduction.wall_minutes(without, 2) < reproduction.wall_minutes(given, 2)
    reproduction.print_plan(without, 2)
    assert re.search(r"^  mrpc +1 run +skipped ", capsys.readouterr().out, re.M)


def test_bad_command_lines_get_one_line(capsys, tmp_path):
    assert reproduce.main(["--only", "fig9", "--plan"]) == 2
    assert capsys.readouterr().err.strip() == ("reproduce.py: error: --only fig9: no such experiment; choose from "
                                               + ", ".join(experiments.EXPERIMENTS))
    assert reproduce.main(["--jobs", "0"]) == 2
    assert reproduce.main(["--hours", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("reproduce.py: error: --hours must be a positive, "
                                                                "finite number of hours, got 0.0")
    assert reproduce.main(["--glue-dir", str(tmp_path / "none"), "--plan"]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert reproduce.main(["--certify", "--only", "main", "--slots", "2"]) == 2  # refused before the check starts
    assert capsys.readouterr().err.strip() == ("reproduce.py: error: --certify runs its own check; leave out --only, "
                                               "--slots")
    with pytest.raises(UsageError):
        reproduce.selected("", False)
    (tmp_path / "afile").write_text("")
    for plan in ([], ["--plan"]):  # a file
        assert reproduce.main(["--only", "analysis", "--runs-dir", str(tmp_path / "afile"), *plan]) == 2
        assert capsys.readouterr().err.strip() == (f"reproduce.py: error: --runs-dir {tmp_path / 'afile'}: a file, "
                                                   "not a folder; pass a folder")
    where = tmp_path / "afile" / "runs"  # a folder that cannot be made
    assert reproduce.main(["--only", "analysis", "--runs-dir", str(where)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"reproduce.py: error: --runs-dir {where}: cannot write there (") and "\n" not in err


def test_the_plan_says_which_experiments_need_a_backend_that_is_not_installed(monkeypatch, capsys):
    real = reproduce.importlib.util.find_spec
    monkeypatch.setattr(reproduce.importlib.util, "find_spec", lambda name: None if name == "torch" else real(name))
    assert reproduce.main(["--plan", "--only", "main,fig5"]) == 0
    assert "  fig5 runs on torch, which is not installed here: install it (README, Backends)" in capsys.readouterr().out


def test_a_protocol_is_drawn_one_line_per_arm_at_its_chosen_rate(tmp_path, monkeypatch):
    """A protocol's figures: the rate grid of seed 1, each arm's curves as the mean of its seeds at the
    chosen rate with bars to the lowest and highest seed, and (arms named PLACEMENT-NL) BLEU against depth."""
    drawn = {}
    monkeypatch.setattr(plots, "plot_panels", lambda path, xlabel, panels, log_x=False:
                        drawn.__setitem__(os.path.basename(path), panels))
    Arm = tables.Arm

    def row(run, lr, loss, bleu):
        return dict(run=run, lr=lr, final_valid_loss=str(loss), test_tokenized_bleu=str(bleu))
    post = [row("post-6L-lr1e-3", 1e-3, 3.5, 20.0), row("post-6L-lr1e-3-seed2", 1e-3, 3.6, 18.0)]
    arms = {"post-6L": Arm("post-6L", {5e-4: row("post-6L-lr5e-4", 5e-4, 3.9, 12.0), 1e-3: post[0]}, 1e-3, post),
            "post-12L": Arm("post-12L", {1e-3: row("post-12L-lr1e-3", 1e-3, "nan", 0.0)}, 1e-3,
                            [row("post-12L-lr1e-3", 1e-3, "nan", 0.0)])}
    premise_fails = {"sgd": Arm("sgd", {0.1: row("sgd-lr1e-1", 0.1, 5.1, 6.0)}, None, [])}
    curve = lambda *values: [dict(updates=str(32 * (i + 1)), valid_loss=str(v), valid_bleu="1.0")  # noqa: E731
                             for i, v in enumerate(values)]
    curves = {"post-6L-lr1e-3": curve(5.0, 4.0), "post-6L-lr1e-3-seed2": curve(6.0, 4.5),
              "post-12L-lr1e-3": curve(7.0, "nan")}
    plots.plot_protocol(arms, curves, [("valid_loss", "validation loss"), ("valid_bleu", "BLEU")],
                        ("test_tokenized_bleu", "test BLEU"), str(tmp_path), "depth")
    assert sorted(drawn) == ["curves-depth.png", "depth.png", "grid-depth.png"]
    loss = drawn["grid-depth.png"][0][1]
    assert loss["post-6L"][:2] == ([5e-4, 1e-3], [3.9, 3.5]) and loss["post-12L"][:2] == ([], [])  # nan: no point
    assert drawn["grid-depth.png"][1][0] == "test BLEU (seed 1)" and drawn["grid-depth.png"][1][1]["post-6L"][1] == [12.0, 20.0]
    xs, mean, errs = drawn["curves-depth.png"][0][1]["post-6L, lr 0.001, 2 seeds"]
    assert xs == [32, 64] and list(mean) == [5.5, 4.25] and [list(e) for e in errs] == [[0.5, 0.25], [0.5, 0.25]]
    assert drawn["curves-depth.png"][0][1]["post-12L, lr 0.001, 1 seed"][0] == [32]
    assert drawn["depth.png"][0][1]["post"] == ([6, 12], [19.0, 0.0], [[1.0, 0.0], [1.0, 0.0]])
    # an arm none of whose rates passes its premise: its grid, no curve
    plots.plot_protocol(premise_fails, {}, [("valid_loss", "validation loss")], ("test_tokenized_bleu", "test BLEU"),
                        str(tmp_path), "fig2")
    assert drawn["grid-fig2.png"][1][1]["sgd"][:2] == ([0.1], [6.0]) and drawn["curves-fig2.png"][0][1] == {}


# --- --smoke, end to end ------------------------------------------------------------------------------------


# Its runs choose their own backends (jax, and torch for BERT): it runs in the torch process, which has the
# fewest tests of its own (tests/run_all_backends.py).
@once("reproduce.py --smoke end to end", backend="torch")
def test_smoke_runs_every_experiment_and_a_killed_one_goes_on(tmp_path):
    """reproduce.py --smoke end to end (train, evaluate, write, judge, draw), killed once on its way: the
    second command finishes, and no run that had finished is run again."""
    runs = tmp_path / "smoke"
    glue = os.path.join(os.path.dirname(ROOT), "shared", "data", "glue")
    command = [sys.executable, os.path.join(ROOT, "reproduce.py"), "--smoke", "--runs-dir", str(runs),
               *(["--glue-dir", glue] if os.path.isdir(glue) else [])]
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    finished = lambda: sorted(f"{p.parent.parent.name}/{p.parent.name}"  # noqa: E731
                              for p in runs.glob("*/*/results.json"))
    assert wait_for(lambda: len(finished()) >= 2, 400), first.stdout.read().decode()
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    before = finished()
    # A guard against a hang, not a speed check (the smoke takes minutes alone; with two training runs and the
    # other backends' tests beside it on 2 cores, it once took more than 25).
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    started = {line.split(": started")[0][3:] for line in done.stdout.splitlines() if ": started" in line}
    assert not set(before) & started  # nothing finished is redone
    results = runs / "results"
    for experiment in experiments.EXPERIMENTS.values():
        if experiment.job == "finetune" and not os.path.isdir(glue):
            assert "mrpc: skipped: GLUE MRPC is not shipped" in done.stdout
            continue
        for figure in experiment.figures:
            assert (results / experiment.folder / figure).is_file(), figure
    assert (results / "fig2" / "results-fig2.csv").is_file() and (results / "main" / "results.json").is_file()
    depth = reproduction.known_runs(experiments.EXPERIMENTS["depth"].smoke(), str(runs / "depth"), premises=False)
    assert len(read_csv(str(results / "depth" / "results-depth.csv"))) == len(depth) == 16  # every stage ran
    fig4 = reproduction.known_runs(experiments.EXPERIMENTS["fig4"].smoke(), str(runs / "fig4"), premises=False)
    timing = json.loads((results / "fig4" / reproduction.TIMING).read_text())
    assert set(timing) == {r.name for r in fig4} and len(fig4) == 10
    verdicts = done.stdout.split("verdicts (smoke")[1]
    for claim in ("Sec 4, Fig 4: Pre-LN", "Fig 2 (Sec 3)", "Fig 4: RAdam", "DeepNet (Fig 1", "Fig 5(a)", "Lemma 2"):
        assert claim in verdicts


def processes_in(path):
    """The ids of the processes whose command line names `path` (Linux: /proc)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if str(path).encode() in cmdline.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


@only_jax
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds processes through /proc")
def test_a_killed_reproduction_stops_its_runs_with_it(tmp_path):
    """`kill PID` of reproduce.py (SIGTERM, which reaches it alone) stops the runs it started too, with one
    line; before, they went on unwatched, and the same command started again ran them twice at once."""
    runs = tmp_path / "runs"
    first = subprocess.Popen([sys.executable, os.path.join(ROOT, "reproduce.py"), "--smoke", "--only", "main",
                              "--runs-dir", str(runs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: any(p != first.pid for p in processes_in(runs)), 120), first.communicate()
        first.send_signal(signal.SIGTERM)
        out, err = first.communicate(timeout=120)
        assert first.returncode == 130 and "reproduce.py: stopped; run the same command again" in err, out + err
        assert wait_for(lambda: not processes_in(runs), 30), processes_in(runs)
    finally:  # no run left behind, whatever failed
        for pid in processes_in(runs):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file locks")
def test_a_second_reproduction_on_the_same_runs_stops_with_one_line(tmp_path, capsys):
    with reproduction.only_one(str(tmp_path)):
        assert reproduce.main(["--only", "main", "--runs-dir", str(tmp_path)]) == 2
    assert f"another reproduce.py (process {os.getpid()}) is running in {tmp_path}" in capsys.readouterr().err
    with reproduction.only_one(str(tmp_path)):  # released when the first ended
        pass
    assert not (tmp_path / ".reproduce.lock").exists()  # nothing left behind


def test_a_reproduction_stops_when_the_code_changes_under_it(tmp_path, monkeypatch):
    """Runs started after an edit record other code: the reproduction stops with one line, not a loop that
    removes and redoes them."""
    monkeypatch.setattr(reproduction, "fingerprint", lambda: "0123456789ab")
    with pytest.raises(UsageError, match="the code changed while reproduce.py ran .* 0123456789ab now"):
        reproduction.reproduce([experiments.EXPERIMENTS["main"]], 1, str(tmp_path / "runs"), str(tmp_path / "results"),
                               engine=Threads(lambda task: None))
    assert not (tmp_path / "runs").exists()


@only_jax
def test_a_run_that_an_ended_run_calls_for_starts_while_the_others_go_on(tmp_path, monkeypatch):
    """Arm a's seed 2 is called for when a's grid run ends: it takes the free place at once, while arm b's
    long run goes on (b's run ends only once it has seen a's seed 2 start). Each experiment publishes as
    its last run ends, and a run's folder is left alone while it starts; a failed run is named at the end
    and the others still run."""
    import threading
    seed2_started, started, lock = threading.Event(), [], threading.Lock()

    def fake_run(task):
        with lock:
            started.append(task.name)
        if task.name.endswith("seed2"):
            seed2_started.set()
        if task.name == "demo/b-lr1e-3":
            assert seed2_started.wait(20), "a's seed 2 waited for b's run to end"
        if task.name == "broken/c-lr1e-3":
            raise UsageError("runs failed: broken/c-lr1e-3 (exit code 1)")
        reproduction.RunDir(task.run_dir).write_results(dict(outcome="finished", final_valid_loss=3.0))

    published = []
    monkeypatch.setattr(reproduction, "publish", lambda experiment, runs, out, results: published.append(
        (experiment.name, sorted(run.name for run in runs))))
    spec = TranslationSpec.build()
    protocol = experiments.tuned([experiments.Arm("a", spec, (1e-3,), (1, 2)), experiments.Arm("b", spec, (1e-3,), (1,))])
    demo = experiments.Experiment("demo", "a demo", "translation", protocol.runs, (), follow=protocol.follow)
    broken = experiments.Experiment("broken", "fails", "translation",
                                    (experiments.Run("c-lr1e-3", spec.but(lr=1e-3)),), ())
    with pytest.raises(UsageError, match=r"runs failed: broken/c-lr1e-3 \(exit code 1; see .*train.log\); fix the cause"):
        reproduction.reproduce([demo, broken], 2, str(tmp_path / "runs"), str(tmp_path / "results"),
                               engine=Threads(fake_run))
    # the first two start on two threads, in either order
    assert sorted(started[:2]) == ["demo/a-lr1e-3", "demo/b-lr1e-3"] and "demo/a-lr1e-3-seed2" in started
    assert published == [("demo", ["a-lr1e-3", "a-lr1e-3-seed2", "b-lr1e-3"])]
    assert set(json.load(open(tmp_path / "results" / "demo" / "timing.json"))) == {"a-lr1e-3", "a-lr1e-3-seed2", "b-lr1e-3"}


@only_jax
def test_the_same_command_runs_only_what_did_not_end_and_records_each_runs_time(tmp_path, monkeypatch):
    """After a run failed, the same command runs it and the stages it unlocks, not the runs that ended;
    each run's wall time goes into timing.json with its arm and seed as fields, its host and its CPU."""
    started, failing = [], {"demo/b-lr1e-3"}

    def fake_run(task):
        started.append(task.name)
        if task.name in failing:
            raise UsageError("runs failed: demo/b-lr1e-3 (exit code 1)")
        run = reproduction.RunDir(task.run_dir)
        run.write_rows([dict(updates=10, valid_loss=3.0)])
        run.write_results(dict(outcome="finished", final_valid_loss=3.0))

    published = []
    monkeypatch.setattr(reproduction, "publish", lambda experiment, runs, out, results: published.append(
        sorted(run.name for run in runs)))
    spec = TranslationSpec.build()
    protocol = experiments.tuned([experiments.Arm("a", spec, (1e-3,), (1, 2)), experiments.Arm("b", spec, (1e-3,), (1,))])
    demo = experiments.Experiment("demo", "a demo", "translation", protocol.runs, (), follow=protocol.follow)
    results, runs = tmp_path / "results", tmp_path / "runs"
    with pytest.raises(UsageError, match="runs failed: demo/b-lr1e-3"):
        reproduction.reproduce([demo], 2, str(runs), str(results), engine=Threads(fake_run))
    assert not published
    plan = reproduction.make_plan([demo], 2, str(results))
    assert [done for done, _ in reproduction.what_is_left(plan, str(runs), str(results))] == [2]
    started.clear()
    failing.clear()
    reproduction.reproduce([demo], 2, str(runs), str(results), engine=Threads(fake_run))
    assert started == ["demo/b-lr1e-3"]
    assert published == [["a-lr1e-3", "a-lr1e-3-seed2", "b-lr1e-3"]]
    timing = json.loads((results / "demo" / reproduction.TIMING).read_text())
    assert set(timing) == {"a-lr1e-3", "a-lr1e-3-seed2", "b-lr1e-3"}
    assert timing["b-lr1e-3"]["cpu"] == reproduction.cpu_name() != "" and timing["b-lr1e-3"]["host"] == "here"
    assert (timing["a-lr1e-3-seed2"]["arm"], timing["a-lr1e-3-seed2"]["seed"]) == ("a", 2)  # fields, not the name
    assert {entry["jobs"] for entry in timing.values()} == {2}  # the runs at a time as each started


@only_jax
def test_a_stopped_run_goes_on_from_its_checkpoint_and_records_no_wall_time(tmp_path, monkeypatch, capsys):
    """A run stopped on its way goes on from its last checkpoint next time (its task's `resume` argv, taken
    because its folder holds a run): the time of its earlier start is not known, so none is recorded, and
    the time recorded before stays."""
    spec = TranslationSpec.build()
    commands = []

    def fake_run(task):
        resumed = reproduction.RunDir(task.run_dir).holds_run()
        commands.append(json.loads((task.resume if resumed else task.command)[-1]).get("resume"))
        reproduction.RunDir(task.run_dir).write_results(dict(outcome="finished", final_valid_loss=3.0))

    monkeypatch.setattr(reproduction, "publish", lambda *args: None)
    demo = experiments.Experiment("demo", "a demo", "translation", (experiments.Run("a-lr1e-3", spec.but(lr=1e-3)),), ())
    runs, results = tmp_path / "runs", tmp_path / "results"
    run = reproduction.RunDir(str(runs / "demo" / "a-lr1e-3"))
    os.makedirs(run.path)
    run.write_config(spec.but(lr=1e-3).config())
    with open(run.state_file, "w") as f:  # stopped after its first epoch
        json.dump(dict(epoch=1, updates=256, checkpoint="epoch1.keras"), f)
    (results / "demo").mkdir(parents=True)
    (results / "demo" / reproduction.TIMING).write_text(json.dumps({"a-lr1e-3": dict(wall_s=600, jobs=2)}))
    reproduction.reproduce([demo], 2, str(runs), str(results), engine=Threads(fake_run))
    assert commands == [True]
    assert json.loads((results / "demo" / reproduction.TIMING).read_text())["a-lr1e-3"]["wall_s"] == 600
    assert "demo/a-lr1e-3: its wall time is not recorded (it went on from a checkpoint)" in capsys.readouterr().out


@only_jax
def test_a_run_started_with_other_settings_starts_afresh_and_a_run_held_back_leaves_nothing(tmp_path, monkeypatch):
    """specs.json records the settings each run started with. A run the deadline held back records nothing
    (an --hours sitting that started no run leaves no file); one that ran and whose settings the experiment
    has since changed is removed and runs again."""
    started = []

    def fake_run(task):
        started.append(task.name)
        reproduction.RunDir(task.run_dir).write_results(dict(outcome="finished", final_valid_loss=3.0))

    monkeypatch.setattr(reproduction, "publish", lambda *args: None)
    spec = TranslationSpec.build()
    runs, results = tmp_path / "runs", tmp_path / "results"

    def demo(lr):
        return experiments.Experiment("demo", "a demo", "translation", (experiments.Run("a", spec.but(lr=lr)),), ())

    _, held = reproduction.reproduce([demo(1e-3)], 2, str(runs), str(results), deadline=time.time() + 60,
                                     engine=Threads(fake_run))  # its first guess: 10 minutes
    assert (held, started) == (1, []) and not (runs / "demo").exists()
    for lr in (1e-3, 1e-3, 2e-3):  # runs; done; other settings: runs again
        reproduction.reproduce([demo(lr)], 2, str(runs), str(results), engine=Threads(fake_run))
        assert json.loads((runs / "demo" / reproduction.SPECS).read_text())["a"]["lr"] == lr
    assert started == ["demo/a", "demo/a"]


@only_jax
def test_hours_starts_no_run_expected_to_end_after_them(tmp_path, monkeypatch, capsys):
    """--hours: a run starts only if the time it recorded (or its experiment's minutes per layer) ends
    within the time given; the others wait for the same command, next time."""
    started = []

    def fake_run(task):
        started.append(task.name)
        reproduction.RunDir(task.run_dir).write_results(dict(outcome="finished", final_valid_loss=3.0))

    spec = TranslationSpec.build()
    protocol = experiments.tuned([experiments.Arm("a", spec, (1e-3,), (1, 2)), experiments.Arm("b", spec, (1e-3,), (1,))])
    demo = experiments.Experiment("demo", "a demo", "translation", protocol.runs, (), follow=protocol.follow)
    (tmp_path / "results" / "demo").mkdir(parents=True)
    (tmp_path / "results" / "demo" / reproduction.TIMING).write_text(json.dumps({  # 1 and 10 minutes
        "a-lr1e-3": dict(wall_s=60, jobs=2, arm="a", seed=1),
        "b-lr1e-3": dict(wall_s=600, jobs=2, arm="b", seed=1)}))
    assert reproduction.run_minutes(demo, demo.runs[0], str(tmp_path / "results")) == 1
    _, held = reproduction.reproduce([demo], 2, str(tmp_path / "runs"), str(tmp_path / "results"),
                                     deadline=time.time() + 5 * 60, engine=Threads(fake_run))
    assert started == ["demo/a-lr1e-3"] and held == 2  # b: 10 minutes; a's seed 2: 5.5 minutes, their mean per layer
    assert "== --hours: 2 runs would have ended after the time given, not started" in capsys.readouterr().out


@only_jax
def test_a_run_under_way_goes_on_first_and_is_expected_to_take_what_is_left(tmp_path):
    """A sitting stopped mid-run leaves its state.json: the next sitting starts that run before the ones not
    begun, and --hours expects of it only the share of its cap left (epoch 3 of 4: a quarter of its time)."""
    started = []

    def stop_midway(task):
        started.append(task.name)
        run = reproduction.RunDir(task.run_dir)
        run.write_json("config.json", dict(code_version=reproduction.code_version()))
        run.write_json("state.json", dict(epoch=3, updates=96, checkpoint="epoch3.keras"))
        raise KeyboardInterrupt  # the sitting ends with this run under way

    def finish(task):
        started.append(task.name)
        reproduction.RunDir(task.run_dir).write_results(dict(outcome="finished", final_valid_loss=3.0))

    spec = TranslationSpec.build().but(epochs=4)
    demo = experiments.Experiment("demo", "a demo", "translation", tuple(
        experiments.Run(name, spec.but(seed=seed)) for seed, name in enumerate(("a", "b", "c"), 1)), ())
    results, runs = tmp_path / "results", str(tmp_path / "runs")
    (results / "demo").mkdir(parents=True)
    (results / "demo" / reproduction.TIMING).write_text(json.dumps(
        {name: dict(wall_s=600, jobs=1) for name in ("a", "b", "c")}))  # 10 minutes each
    for run in demo.runs[:0:-1]:  # two sittings, each stopped with one run under way: c, then b
        with pytest.raises(KeyboardInterrupt):
            reproduction.reproduce([dataclasses.replace(demo, runs=(run,))], 1, runs, str(results),
                                   engine=Threads(stop_midway, slots=1))
    assert started == ["demo/c", "demo/b"]
    assert reproduction.share_left(demo.runs[1], os.path.join(runs, "demo", "b")) == 0.25
    started.clear()
    _, held = reproduction.reproduce([demo], 1, runs, str(results), deadline=time.time() + 6 * 60,
                                     engine=Threads(finish, slots=1))
    assert started == ["demo/b", "demo/c"] and held == 1  # under way: 2.5 minutes each; a: 10, held back


@pytest.mark.parametrize("flags, expected", [
    (["--slots", str(10 ** 12)], "--slots must be a positive number of runs at a time, at most 10,000"),
    (["--hours", "inf"], "--hours must be a positive, finite number of hours, got inf"),
    (["--only", "mrpc"], "--only mrpc: GLUE MRPC is not shipped with the project"),
    (["--only", "analysis", "--address", "127.0.0.1:1"], "--address 127.0.0.1:1: no Ray cluster answers there"),
])
def test_a_refusal_is_one_line_and_leaves_no_runs_folder(flags, expected, capsys, tmp_path):
    """Too many slots, endless hours, an experiment that cannot run here (MRPC without --glue-dir: not an empty
    "verdicts:" and exit code 0), a cluster that does not answer: one line, exit code 2, and no runs folder made."""
    runs = tmp_path / "runs" / "reproduce"
    assert reproduce.main([*flags, "--runs-dir", str(runs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"reproduce.py: error: {expected}"), err
    assert os.listdir(tmp_path) == []


def test_an_analysis_publishes_no_placement(tmp_path):
    """placement.json (where each start of a run ran) stays in the run folder: results/ holds the analysis's own files."""
    analysis = experiments.EXPERIMENTS["analysis"]
    run = reproduction.RunDir(str(tmp_path / "runs" / analysis.runs[0].name))
    os.makedirs(run.path)
    run.add_placement(dict(host="here"))
    run.write_json("lemma2.json", dict(x=1))
    reproduction.publish(analysis, analysis.runs, str(tmp_path / "runs"), str(tmp_path / "results"))
    assert sorted(os.listdir(tmp_path / "results" / analysis.folder)) == ["lemma2.json"]
