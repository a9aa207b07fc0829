"""A run's spec (harness/specs.py), the experiments as data (harness/experiments.py) and reproduce.py: the
specs are built once and never change; each experiment's runs are the settings its results were measured
with; the plan adds up recorded times; --smoke runs every experiment's pipeline, and a reproduction killed
on its way goes on without redoing finished runs."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import analyze_grads
import pretrain_bert
import reproduce
import train_nmt
from harness import experiments, reproduction
from harness.errors import UsageError
from harness.files import read_csv
from harness.specs import BertSpec, TranslationSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "results")
only_jax = pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "tensorflow") != "jax",
                              reason="process handling and files, the same on every backend: run once, under jax")


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
                  and getattr(spec, k) != (tuple(v.split(",")) if k == "norms" else v)}
        assert differ == {}, module.__name__


def test_config_json_holds_every_field_and_what_was_given(tmp_path):
    from harness.rundir import RunDir

    spec = train_nmt.parse_args(["--norm", "deepnorm", "--lr", "5e-4"])
    run_dir = RunDir.start(str(tmp_path / "run"), resume=False)
    run_dir.write_config(spec, dict(data="x"))
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


@pytest.mark.parametrize("name", ["main", "fig2", "fig4", "depth"])
def test_each_translation_experiment_runs_what_its_results_were_measured_with(name):
    """`--sweep NAME` with no other flag (and reproduce.py) runs the settings of the results in results/NAME."""
    experiment = experiments.EXPERIMENTS[name]
    assert [run.spec for run in experiment.runs] == (
        [run.spec for run in experiments.sweep_runs(name, train_nmt.parse_args([]))] if name != "main" else
        [train_nmt.parse_args(["--norm", "pre", "--no-warmup"])])
    for run in experiment.runs:
        spec, result = run.spec, recorded(experiment, run.name)
        assert (result["norm"], result["layers"], result["lr"], result["optimizer"]) == (
            spec.norm, [spec.encoder_layers, spec.decoder_layers], spec.lr, spec.optimizer), run.name
        assert (result["warmup"], result["schedule"], result["test_beam"]) == (
            not spec.no_warmup, spec.schedule, spec.beam), run.name
        epochs = result["updates"] / max(1, result["epochs"])
        assert result["epochs"] == spec.epochs and 240 <= epochs <= 260, run.name  # 256 packed updates an epoch
    if name == "main":  # every setting config.json recorded, but where it lives and the objects it serialised
        with open(os.path.join(RESULTS, "main", "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        spec = experiment.runs[0].spec.config()
        skip = {"out", "resume", "given", "schedule", "batching", "test_sentences"}
        assert {k: (v, config[k]) for k, v in spec.items() if k in config and k not in skip and config[k] != v} == {}


def test_the_depth_experiment_has_two_seeds_and_fig5_its_1000_updates():
    depth = experiments.EXPERIMENTS["depth"]
    assert sorted({run.spec.seed for run in depth.runs}) == [1, 2] and len(depth.runs) == 12
    assert {(r.spec.encoder_layers, r.spec.d_model, r.spec.epochs, r.spec.warmup_steps) for r in depth.runs} == {
        (6, 128, 2, 200), (12, 128, 2, 200)}
    fig5 = {run.name: run.spec for run in experiments.EXPERIMENTS["fig5"].runs}
    table = {r["run"]: r for r in read_csv(os.path.join(RESULTS, "fig5", "results.csv"))}
    assert {name: (s.steps, s.norm, s.no_warmup) for name, s in fig5.items()} == {
        "post-warmup": (1000, "post", False), "pre-no-warmup": (1000, "pre", True)}
    assert {name: int(table[name]["updates"]) for name in fig5} == {"post-warmup": 1000, "pre-no-warmup": 1000}
    assert fig5["post-warmup"].warmup_steps == 100 and isinstance(fig5["post-warmup"], BertSpec)


def test_a_user_flag_reaches_every_run_but_those_it_would_blur():
    base = train_nmt.parse_args(["--epochs", "1", "--norm", "pre", "--seed", "3"])
    runs = experiments.sweep_runs("depth", base)
    assert {run.spec.epochs for run in runs} == {1} and {run.spec.seed for run in runs} == {3}
    assert [run.spec.norm for run in runs[:3]] == ["post", "pre", "deepnorm"] and len(runs) == 6  # one seed given


def test_smoke_experiments_keep_the_runs_but_shrink_them():
    for experiment in experiments.EXPERIMENTS.values():
        small = experiment.smoke()
        assert [r.name for r in small.runs] == [r.name for r in experiment.runs]
        for big, tiny in zip(experiment.runs, small.runs):
            assert tiny.spec.preset == "tiny"
            for field in ("norm", "optimizer", "lr", "no_warmup", "seed", "recipe", "finetune"):
                assert getattr(tiny.spec, field, None) == getattr(big.spec, field, None), (experiment.name, field)


# --- the plan --------------------------------------------------------------------------------------------

def test_plan_lists_every_experiment_with_a_time_and_a_total(capsys):
    assert reproduce.main(["--plan"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:-1]] == list(experiments.EXPERIMENTS)
    total = lines[-1]
    assert total.startswith("  total: about ") and "--jobs 2" in total
    hours, minutes = (int(v) for v in total.split("about ")[1].split(" with")[0].replace(" h ", " ").split())
    assert 60 <= 60 * hours + minutes <= 240  # an afternoon on 2 cores


def test_plan_prefers_the_times_a_reproduction_recorded(tmp_path):
    fig4 = experiments.EXPERIMENTS["fig4"]
    folder = tmp_path / "fig4"
    folder.mkdir()
    (folder / reproduction.TIMING).write_text(json.dumps({r.name: dict(wall_s=600, jobs=2) for r in fig4.runs}))
    (experiment, minutes, source), = reproduction.make_plan([fig4], 2, str(tmp_path))
    assert minutes == 40 and source == f"fig4/{reproduction.TIMING}"
    (experiment, minutes, source), = reproduction.make_plan([fig4], 2, str(tmp_path / "nothing"))
    assert minutes == fig4.minutes and source.startswith("a first guess")


def test_bad_command_lines_get_one_line(capsys, tmp_path):
    assert reproduce.main(["--only", "fig9", "--plan"]) == 2
    assert capsys.readouterr().err.strip() == ("reproduce.py: error: --only fig9: no such experiment; choose from "
                                               + ", ".join(experiments.EXPERIMENTS))
    assert reproduce.main(["--jobs", "0"]) == 2
    assert reproduce.main(["--glue-dir", str(tmp_path / "none"), "--plan"]) == 2
    assert "no such folder" in capsys.readouterr().err
    with pytest.raises(UsageError):
        reproduce.selected("", False)


# --- --smoke, end to end ------------------------------------------------------------------------------------

def wait_for(condition, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if condition():
            return True
        time.sleep(1)
    return False


@only_jax
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
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
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
    assert len(read_csv(str(results / "depth" / "results-depth.csv"))) == 12
    timing = json.loads((results / "fig4" / reproduction.TIMING).read_text())
    assert set(timing) <= {r.name for r in experiments.EXPERIMENTS["fig4"].runs}
    verdicts = done.stdout.split("verdicts (smoke")[1]
    for claim in ("Sec 4: Pre-LN", "Fig 2 (Sec 3)", "Fig 4: RAdam", "DeepNet (Fig 1", "Fig 5(a)", "Lemma 2"):
        assert claim in verdicts
