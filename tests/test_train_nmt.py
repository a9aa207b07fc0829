"""train_nmt.py end to end on a tiny corpus: training, resume, decoding, BLEU, sweeps, bad input."""

import json
import os
import re

import keras
import numpy as np
import pytest
from conftest import once, tiny_translation, to_numpy

import train_nmt
from harness import benchmark, callbacks, flops, nmt_data, nmt_job
from reproduction import experiments, sweeps
from harness.console import UsageError
from harness.files import read_csv, write_csv


def run(corpus_dir, out, *extra):
    # At most 20 tokens a translation: the untrained models here never end one, and 200 (the default) steps
    # of decoding would take most of a test's time.
    return train_nmt.main(["--preset", "tiny", "--data-dir", str(corpus_dir), "--out", str(out), "--beam", "2",
                           "--vocab-size", "120", "--max-len-b", "20", *extra])


@pytest.fixture(scope="module")
def trained_run(corpus_dir, tmp_path_factory):
    """A finished run for each --dictionaries, trained once (when a test first asks for it) for the tests
    that only read it or refuse to write over it."""
    made = {}

    def get(dictionaries="joint"):
        if dictionaries not in made:
            out = tmp_path_factory.mktemp(f"trained-{dictionaries}") / "run"
            assert run(corpus_dir, out, "--max-updates", "30", "--norm", "pre", "--no-warmup", "--lr", "3e-3",
                       "--dictionaries", dictionaries) == 0  # a fresh directory: the run starts
            made[dictionaries] = out
        return made[dictionaries]

    return get


def test_two_training_steps_end_to_end(corpus_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(corpus_dir, out, "--max-updates", "2", "--norm", "pre", "--no-warmup", "--log-every", "1") == 0
    for name in ("config.json", "metrics.csv", "results.json", "curves.png", "state.json", "checkpoints/epoch1.keras"):
        assert (out / name).is_file(), name
    results = json.loads((out / "results.json").read_text())
    assert results["outcome"] == "finished" and results["updates"] == 2
    assert 0 <= results["test_bleu"] <= 100 and "tok:13a" in results["test_signature"]
    config = json.loads((out / "config.json").read_text())
    assert config["norm"] == "pre" and config["backend"] and config["schedule"]["class_name"] == "StepDecay"
    assert config["max_len_b"] == results["test_max_len_b"] == 20 and config["min_len"] == results["test_min_len"] == 1
    rows = read_csv(str(out / "metrics.csv"))
    assert len(rows) == 1 and float(rows[0]["valid_loss"]) > 0 and float(rows[0]["grad_norm"]) > 0
    printed = capsys.readouterr().out
    assert "test BLEU" in printed and "data:" in printed
    # Output to a pipe (as here): progress lines (from the second update: the first includes compiling)
    # and a line before test decoding.
    progress = [line for line in printed.splitlines() if line.startswith("progress: ")]
    assert len(progress) == 1 and progress[0].startswith("progress: update 2/2 (100%), loss ")
    assert " elapsed, ETA " in progress[0] and "\ntest: decoding " in printed
    assert not [p for p in os.listdir(out) if ".tmp" in p or p.startswith(".partial")]
    # The time spent compiling, on jax (tracing, lowering, XLA): in results.json and one printed line.
    if keras.backend.backend() == "jax":
        assert 0 < results["compile_s"] and 0 < results["compile_share"] < 1
        assert re.search(r"^compiling: \d+s of \d+s \(\d+ %\), \d+ compilations", printed, re.M)
        # The programs jax compiled (or loaded): the train and validation steps, two per decoding bucket,
        # and Keras's eager initialisation; 32 here. An operation run outside a compiled function adds a
        # program per shape (a tiny Multi30k run: 56 before decoding's arrays and the logged rate stayed
        # out of eager operations, 40 after).
        assert results["compile_programs"] <= 34, results["compile_programs"]
    else:
        assert "compile_s" not in results and "\ncompiling: " not in printed


def test_resume_continues_from_the_checkpoint(corpus_dir, tmp_path):
    out = tmp_path / "run"
    assert run(corpus_dir, out, "--epochs", "1", "--norm", "deepnorm") == 0
    first = read_csv(str(out / "metrics.csv"))
    assert run(corpus_dir, out, "--epochs", "2", "--norm", "deepnorm", "--resume") == 0
    rows = read_csv(str(out / "metrics.csv"))
    assert [r["epoch"] for r in rows] == ["1", "2"]
    assert rows[0] == first[0]
    assert int(rows[1]["updates"]) == 2 * int(rows[0]["updates"])  # the optimizer's count carried on
    state = json.loads((out / "state.json").read_text())
    assert state["epoch"] == 2 and state["checkpoint"].endswith("epoch2.keras")


def test_resume_needs_a_run_and_a_fresh_run_needs_a_fresh_directory(corpus_dir, trained_run, tmp_path, capsys):
    assert run(corpus_dir, tmp_path / "none", "--resume") == 2
    assert "no finished epoch to resume from" in capsys.readouterr().err
    out = trained_run("joint")  # trained into a fresh directory
    assert run(corpus_dir, out, "--max-updates", "1", "--no-warmup") == 2
    assert "already holds a run" in capsys.readouterr().err
    # a run that has ended, resumed with the flags it ended under: it says so and changes nothing
    before = {name: (out / name).read_bytes() for name in ("results.json", "metrics.csv", "state.json")}
    assert run(corpus_dir, out, "--resume", "--max-updates", "30", "--norm", "pre", "--no-warmup", "--lr", "3e-3") == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(r"train_nmt\.py: error: --resume: \S+ has ended \(finished after \d+ updates, results\.json\) "
                        r"and these flags train it no further; nothing changed \(.*\)", err), err
    assert {name: (out / name).read_bytes() for name in before} == before


def test_resume_without_flags_keeps_the_runs_own_length(corpus_dir, tmp_path, capsys):
    """A run that ended at its --max-updates, resumed with no flag at all: its length is its own (config.json),
    so it has ended, and the resume says so and changes nothing (it once trained on to the preset's epochs, or
    decoded the test set again)."""
    out = tmp_path / "run"
    assert run(corpus_dir, out, "--max-updates", "4", "--test-sentences", "2") == 0
    before = {name: (out / name).read_bytes() for name in ("results.json", "metrics.csv", "state.json")}
    capsys.readouterr()
    assert train_nmt.main(["--resume", "--out", str(out)]) == 2
    assert "has ended (finished after 4 updates, results.json)" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in before} == before


def test_fairseqs_flag_names_point_to_this_projects(capsys):
    with pytest.raises(SystemExit) as exit_:
        train_nmt.parse_args(["--encoder-normalize-before"])
    assert exit_.value.code == 2
    assert "fairseq's --encoder-normalize-before is --norm pre (Pre-LN in the encoder and the decoder) here" in \
        capsys.readouterr().err


def greedy(model, source, steps):
    """Uncached greedy decoding: the full decoder on the growing prefix, argmax at each step (never
    padding, and EOS not first: fairseq-generate's --min-len 1)."""
    prefix = np.full((source.shape[0], 1), nmt_data.EOS, "int32")
    for step in range(steps):
        logits = to_numpy(model({"source_ids": source, "decoder_input_ids": prefix}))[:, -1]
        logits[:, [nmt_data.PAD] + ([nmt_data.EOS] if step == 0 else [])] = -np.inf
        prefix = np.concatenate([prefix, logits.argmax(-1)[:, None].astype("int32")], axis=1)
    return prefix[:, 1:]


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_beam_one_equals_greedy_and_the_cache(norm):
    model = tiny_translation(norm, vocab_size=30)
    rng = np.random.default_rng(3)
    source = rng.integers(3, 30, (3, 6)).astype("int32")
    source[:, -1] = nmt_data.EOS
    model(dict(source_ids=source, decoder_input_ids=source))
    hyps = nmt_job.beam_search(model, source, beam=1, lenpen=1.0, max_len_a=0, max_len_b=5)
    reference = greedy(model, source, 5)
    for hyp, ref in zip(hyps, reference):
        ref = list(ref)
        expected = ref[: ref.index(nmt_data.EOS)] if nmt_data.EOS in ref else ref  # at most 5 tokens
        assert hyp == [int(t) for t in expected]


def test_beam_search_scores_with_length_penalty():
    """A wider beam never finds a worse model score (sum log p / len^lenpen) than greedy."""
    model = tiny_translation("pre", vocab_size=25)
    source = np.random.default_rng(4).integers(3, 25, (2, 5)).astype("int32")
    model(dict(source_ids=source, decoder_input_ids=source))

    def score(row, hyp):
        target = list(hyp) + [nmt_data.EOS]
        decoder_in = np.array([[nmt_data.EOS] + list(hyp)], "int32")
        logits = to_numpy(model({"source_ids": source[row:row + 1], "decoder_input_ids": decoder_in}))[0]
        logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
        return sum(logp[i, t] for i, t in enumerate(target)) / len(target) ** 1.2

    narrow = nmt_job.beam_search(model, source, beam=1, lenpen=1.2, max_len_a=0, max_len_b=6)
    wide = nmt_job.beam_search(model, source, beam=4, lenpen=1.2, max_len_a=0, max_len_b=6)
    for row in range(2):
        assert score(row, wide[row]) >= score(row, narrow[row]) - 1e-4


def test_bleu_of_the_references_against_themselves_is_100():
    refs = ["The dog sees the cat.", "A small child is sleeping in the garden, because it is tired."]
    raw = nmt_data.Corpus("x", "x", bpe_split=False)
    scores = nmt_job.bleu_scores(refs, refs, raw, "en")
    assert scores["bleu"] == 100.0 and scores["tokenized_bleu"] == 100.0
    tokenized = ["the dog sees the cat .", "a small child is sleeping ."]
    assert nmt_job.bleu_scores(tokenized, tokenized, nmt_data.Corpus("y", "y", bpe_split=True), "en")["bleu"] == 100.0
    assert nmt_job.bleu_scores(["a cat"], ["the dog sees the cat ."], raw, "en")["bleu"] < 20


def test_schedules_follow_the_paper():
    from schedules import InverseSquareRoot, LinearWarmup, StepDecay

    args = train_nmt.parse_args(["--lr", "1e-3"])
    schedule = nmt_job.translation_schedule(args, 100, 1000)
    assert isinstance(schedule, LinearWarmup) and isinstance(schedule.after, InverseSquareRoot)
    args = train_nmt.parse_args(["--no-warmup", "--schedule", "inverse_sqrt"])  # Figure 2: warmup = 1
    schedule = nmt_job.translation_schedule(args, 100, 1000)
    assert isinstance(schedule, InverseSquareRoot) and schedule.decay_start == 1
    args = train_nmt.parse_args(["--no-warmup"])  # Section 4: step decay at --decay-epoch
    schedule = nmt_job.translation_schedule(args, 100, 1000)
    assert isinstance(schedule, StepDecay) and schedule.boundaries == [args.decay_epoch * 100]


def test_divergence_is_a_result_not_a_crash(corpus_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code = run(corpus_dir, out, "--optimizer", "sgd", "--lr", "1e12", "--no-warmup", "--schedule", "constant",
               "--max-updates", "8", "--norm", "pre")
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["outcome"] == "diverged"
    rows = read_csv(str(out / "metrics.csv"))
    assert rows[-1]["outcome"] == "diverged"
    assert "diverged" in capsys.readouterr().out


def test_plateaued_after_patience_validations_without_a_better_loss():
    plateaued = __import__("harness.callbacks", fromlist=["plateaued"]).plateaued
    assert not plateaued([5.0, 4.0, 3.9], 2, 0.01)  # 3.9 improves on 4.0 by 0.1
    assert plateaued([5.0, 4.0, 3.995, 3.992], 2, 0.01)  # the last two are within 0.01 of 4.0
    assert not plateaued([5.0, 4.0, 3.995], 2, 0.01)  # not yet 2 validations after the best
    assert not plateaued([5.0, 4.0, 3.995, 3.992], 0, 0.01)  # off
    assert plateaued([3.0, 3.5, 3.2, 3.1], 3, 0.0)  # worse counts as not better


def test_patience_stops_training_at_the_plateau_and_decodes(corpus_dir, tmp_path):
    out = tmp_path / "run"
    # a better loss must be 100 nats better: after the first validation, two more end it
    assert run(corpus_dir, out, "--max-updates", "20", "--eval-every", "1", "--patience", "2", "--min-delta", "100",
               "--norm", "pre", "--no-warmup", "--schedule", "constant", "--test-sentences", "4") == 0
    results = json.loads((out / "results.json").read_text())
    assert results["outcome"] == "finished" and results["updates"] == results["plateau_at"] == 3
    assert len(read_csv(str(out / "metrics.csv"))) == 3 and 0 <= results["test_bleu"] <= 100


def test_patience_waits_for_the_step_of_a_step_schedule(corpus_dir, tmp_path):
    """A schedule with its step still to make has not reached its plateau (results/protocols.md, 2026-12-06):
    the rule that ends a constant run at update 3 ends a step run at its first validation after the step."""
    out = tmp_path / "run"
    assert run(corpus_dir, out, "--max-updates", "20", "--eval-every", "1", "--patience", "2", "--min-delta", "100",
               "--norm", "pre", "--no-warmup", "--decay-epoch", "1", "--epochs", "3", "--test-sentences", "4") == 0
    step = json.loads((out / "config.json").read_text())["updates_per_epoch"]
    assert 3 <= step < 19  # the test's premise: the rule alone would stop before the step
    assert json.loads((out / "results.json").read_text())["plateau_at"] == step + 1


def test_sweep_fig2_gives_each_run_its_settings():
    """Each run of the plan as a spec: what it is trained with (config.json records these fields and this
    schedule), the command line's flags reaching every run but where a run sets its own."""
    argv = ["--preset", "tiny", "--sweep", "fig2", "--max-updates", "2", "--beam", "1", "--vocab-size", "120",
            "--max-len-b", "20", "--warmup-steps", "0"]
    command = train_nmt.parse_command(argv)
    train_nmt.check_args(command)
    runs = experiments.sweep_runs(command.sweep, command.spec)
    trained = {run.name: dict(run.spec.config(), schedule=keras.saving.serialize_keras_object(
        nmt_job.translation_schedule(run.spec, 10, run.spec.max_updates))) for run in runs}
    config = trained["post-nowarmup-lr5e-4"]
    assert config["lr"] == 5e-4 and config["schedule"]["class_name"] == "InverseSquareRoot"
    control = trained["pre-constant-lr5e-4"]
    assert control["norm"] == "pre" and control["schedule"] == 5e-4  # the same constant rate from update 1
    assert trained["post-constant-lr5e-4"]["schedule"] == 5e-4
    # The command line's --warmup-steps 0 reaches the runs that do not set a warmup of their own.
    assert trained["post-warmup-lr5e-4"]["warmup_steps"] == 0
    short = trained["post-warmup1-lr5e-4"]  # Figure 2's warmup 500
    assert short["warmup_steps"] == 1 and short["schedule"]["class_name"] == "LinearWarmup"
    sgd = [trained[f"post-sgd-{flag}-lr5e-3"] for flag in ("warmup", "nowarmup")]
    assert {c["optimizer"] for c in sgd} == {"sgd"} and [c["no_warmup"] for c in sgd] == [False, True]
    assert all(c["max_updates"] == 2 and c["beam"] == 1 for c in trained.values())  # the command line's own flags
    assert len(trained) == 8


@once("a sweep's plan, its runs' settings and its tables")
def test_sweep_fig2_trains_picked_runs_and_writes_a_table_and_an_overlay(corpus_dir, tmp_path, capsys):
    """Three runs of the plan trained for real: each writes the config.json its flags ask for."""
    out = tmp_path / "sweep"
    picked = ["post-warmup1-lr5e-4", "post-sgd-nowarmup-lr5e-3", "pre-constant-lr5e-4"]
    code = train_nmt.main(["--preset", "tiny", "--data-dir", str(corpus_dir), "--out", str(out), "--sweep", "fig2",
                           "--max-updates", "2", "--beam", "1", "--vocab-size", "120", "--max-len-b", "20", "--warmup-steps", "0",
                           "--runs", ",".join(reversed(picked))])
    assert code == 0
    table = read_csv(str(out / "results-fig2.csv"))
    assert [r["run"] for r in table] == picked  # in the plan's order
    assert all(r["outcome"] == "finished" for r in table)
    assert (out / "curves-fig2.png").is_file()
    short = json.loads((out / "post-warmup1-lr5e-4" / "config.json").read_text())  # Figure 2's warmup 500
    assert short["warmup_steps"] == 1 and short["schedule"]["class_name"] == "LinearWarmup"
    control = json.loads((out / "pre-constant-lr5e-4" / "config.json").read_text())
    assert control["norm"] == "pre" and control["schedule"] == 5e-4  # the same constant rate from update 1
    sgd = json.loads((out / "post-sgd-nowarmup-lr5e-3" / "config.json").read_text())
    assert sgd["optimizer"] == "sgd" and sgd["no_warmup"] and sgd["lr"] == 5e-3 and sgd["warmup_steps"] == 0
    assert "post-warmup1-lr5e-4" in capsys.readouterr().out
    assert sorted(name for name in os.listdir(out) if name != ".lock") == sorted(
        picked + ["curves-fig2.png", "results-fig2.csv"])  # the others not run


def test_fig2_plan_has_the_papers_grid():
    """Section 3.2: Adam at 5e-4 and 1e-3 with warmup 4000, 500 and none; SGD at 5e-3 and 1e-3 with and without."""
    settings = set()
    for run in experiments.sweep_runs("fig2", train_nmt.parse_args(["--preset", "iwslt"])):
        args = run.spec
        if args.norm == "post" and args.schedule == "inverse_sqrt":
            settings.add((args.optimizer, args.lr, 0 if args.no_warmup else args.warmup_steps))
    assert settings == {(opt, lr, warmup) for opt, lrs, warmups in (("adam", (5e-4, 1e-3), (4000, 500, 0)),
                                                                     ("sgd", (5e-3, 1e-3), (4000, 0)))
                        for lr in lrs for warmup in warmups}


def test_sweep_runs_flag_picks_runs_and_rejects_unknown_names(capsys):
    command = train_nmt.parse_command(["--sweep", "fig2", "--runs", "post-warmup38-lr1e-3,post-sgd-warmup-lr3e-2"])
    train_nmt.check_args(command)
    with pytest.raises(UsageError, match="post-warmup500-lr1e-3: not in the fig2 sweep at --preset cpu"):
        train_nmt.check_args(train_nmt.parse_command(["--sweep", "fig2", "--runs", "post-warmup500-lr1e-3"]))
    with pytest.raises(UsageError, match="--runs only applies with --sweep"):
        train_nmt.check_args(train_nmt.parse_command(["--runs", "post-warmup-lr1e-3"]))


def test_cpu_fig2_plan_is_its_own_control():
    """At the cpu preset every fig2 run has one constant rate; the no-warmup runs differ only in placement."""
    runs = {run.name: run.spec for run in experiments.sweep_runs("fig2", train_nmt.parse_args([]))}
    # Adam: 4 arms at the paper's two rates, 3 seeds each; SGD with warmup at its 4 rates
    assert len(runs) == 4 * 2 * 3 + 4 and {spec.schedule for spec in runs.values()} == {"constant"}
    post, pre = (runs[f"{norm}-nowarmup-lr1e-3"].config() for norm in ("post", "pre"))
    assert {k for k in post if post[k] != pre[k] and k != "flags"} == {"norm"}  # flags: what each run was given
    assert not runs["post-warmup-lr1e-3"].no_warmup and runs["post-warmup-lr1e-3"].warmup_steps == 300


@once("a sweep's plan, its runs' settings and its tables")
def test_sweep_depth_plans_every_placement_at_every_depth_and_runs_the_picked_ones(corpus_dir, tmp_path, capsys):
    plan = experiments.sweep_runs("depth", train_nmt.parse_args(["--preset", "tiny"]), (1, 2))
    assert [run.name for run in plan] == [f"{n}-{d}L" for d in (1, 2) for n in ("post", "pre", "deepnorm")]
    # Three of the six runs (each placement, each depth) train; --runs keeps the plan's order.
    out = tmp_path / "sweep"
    code = train_nmt.main(["--preset", "tiny", "--data-dir", str(corpus_dir), "--out", str(out), "--sweep", "depth",
                           "--depths", "1,2", "--max-updates", "3", "--beam", "1", "--vocab-size", "120", "--max-len-b", "20",
                           "--eval-every", "2", "--runs", "deepnorm-2L,post-1L,pre-2L"])
    assert code == 0
    table = read_csv(str(out / "results-depth.csv"))
    assert [(r["norm"], r["layers"]) for r in table] == [("post", "1"), ("pre", "2"), ("deepnorm", "2")]
    assert all(r["outcome"] == "finished" and float(r["test_tokenized_bleu"]) >= 0 for r in table)
    config = json.loads((out / "deepnorm-2L" / "config.json").read_text())
    assert config["encoder_layers"] == config["decoder_layers"] == 2
    first = json.loads((out / "post-1L" / "config.json").read_text())
    assert {k: first[k] for k in ("lr", "schedule")} == {k: config[k] for k in ("lr", "schedule")}  # one schedule for all
    assert [r["updates"] for r in read_csv(str(out / "pre-2L" / "metrics.csv"))] == ["2", "3"]
    assert (out / "depth.png").is_file() and (out / "curves-depth.png").is_file()
    assert "deepnorm-2L" in capsys.readouterr().out


@once("process handling")
def test_sweep_runs_in_parallel_processes_and_resumes(corpus_dir, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["--preset", "tiny", "--data-dir", str(corpus_dir), "--out", str(out), "--sweep", "depth", "--depths", "1",
            "--max-updates", "3", "--beam", "1", "--vocab-size", "120", "--max-len-b", "20", "--jobs", "2",
            "--runs", "post-1L,pre-1L"]
    assert train_nmt.main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.count("started (1 thread") == 2 and "post-1L: finished" in printed
    assert "data:" in (out / "pre-1L" / "train.log").read_text()
    assert len(read_csv(str(out / "results-depth.csv"))) == 2
    assert train_nmt.main(argv + ["--resume"]) == 0  # finished runs are not run again
    assert capsys.readouterr().out.count("done already") == 2


@pytest.mark.parametrize("dictionaries", ["joint", "separate"])
def test_translate_writes_one_line_per_input_line(dictionaries, corpus_dir, trained_run, tmp_path, capsys):
    """--translate of a trained run: the run's vocabularies and beam, the same hypotheses as its test
    decoding, a blank line for a blank line, and nothing but translations on standard output."""
    out = trained_run(dictionaries)
    results = json.loads((out / "results.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert ("source_vocab_file" in config) == (dictionaries == "separate")
    model = callbacks.load_checkpoint(str(out / "checkpoints" / "epoch1.keras"))
    assert (model.get_config()["source_vocab_size"] is None) == (dictionaries == "joint")
    sources = (corpus_dir / "test.de").read_text(encoding="utf-8").splitlines()[:3]
    text = tmp_path / "input.de"
    text.write_text(f"{sources[0]}\n\n{sources[1]}\n{sources[2]}\n", encoding="utf-8")
    capsys.readouterr()
    assert train_nmt.main(["--translate", str(out), "--input", str(text)]) == 0
    captured = capsys.readouterr()
    lines = captured.out.split("\n")
    assert len(lines) == 5 and lines[-1] == "" and lines[1] == ""  # four lines, each ended by a newline
    assert [lines[0], lines[2], lines[3]] == results["test_example"]
    assert "beam 2" in captured.err and "epoch1.keras" in captured.err
    assert "max length 0 x source + 20, min length 1, unkpen 0" in captured.err  # the run's own length rules
    assert train_nmt.main(["--translate", str(out / "checkpoints" / "epoch1.keras"), "--input", str(text),
                           "--beam", "1"]) == 0
    assert "beam 1" in capsys.readouterr().err


@once("standard input and output of --translate")
def test_translate_in_a_pipe(trained_run, tmp_path):
    """The command as a user pipes it: standard input to standard output, the log on standard error."""
    import subprocess
    import sys

    out = trained_run("joint")
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "train_nmt.py")
    proc = subprocess.run([sys.executable, script, "--translate", str(out)], input="Der Hund schläft.\n\nEin Kind.\n",
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 3 and proc.stdout.split("\n")[1] == ""
    assert "translating with" in proc.stderr and "translating with" not in proc.stdout
    bad = subprocess.run([sys.executable, script, "--translate", str(tmp_path / "nowhere")], input="x\n",
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [f"train_nmt.py: error: --translate {tmp_path / 'nowhere'}: file not found; "
                                               "pass a .keras file that a run wrote (runs/NAME/checkpoints/) or a run "
                                               "directory (runs/NAME)"]


def bad_data(tmp_path, corpus_dir, kind):
    data = tmp_path / "data"
    data.mkdir()
    for name in os.listdir(corpus_dir):
        (data / name).write_bytes((corpus_dir / name).read_bytes())
    if kind == "missing":
        os.remove(data / "valid.en")
    elif kind == "mismatch":
        (data / "train.en").write_text("one\ntwo\n", encoding="utf-8")
    elif kind == "empty":
        (data / "train.de").write_text("", encoding="utf-8")
        (data / "train.en").write_text("", encoding="utf-8")
    elif kind == "utf8":
        (data / "test.de").write_bytes(b"ok\n\xc3\x28 broken\n")
    return data


@pytest.mark.parametrize("kind, message", [
    ("missing", "valid.en: file not found"),
    ("mismatch", "train.de has 70 lines but"),
    ("empty", "are empty; the train split needs sentence pairs"),
    ("utf8", "test.de: line 2 is not valid UTF-8"),
])
def test_bad_data_exits_2_with_one_line(kind, message, corpus_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(bad_data(tmp_path, corpus_dir, kind), out) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize("extra, message", [
    (["--norm", "sandwich"], "argument --norm: invalid choice: 'sandwich' (choose from 'post', 'pre', 'deepnorm')"),
    (["--lr", "-0.001"], "--lr must be positive"),
    (["--schedule", "cosine"], "argument --schedule: invalid choice: 'cosine'"),
    (["--optimizer", "adagrad"], "argument --optimizer: invalid choice: 'adagrad'"),
    (["--preset", "huge"], "argument --preset: invalid choice: 'huge'"),
    (["--warmup-steps", "500", "--epochs", "1"], "is not shorter than training"),
])
def test_bad_arguments_exit_2_with_one_line(extra, message, corpus_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert run(corpus_dir, out, *extra) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_unwritable_output_directory(corpus_dir, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert run(corpus_dir, blocker / "run") == 2
    assert "cannot write there" in capsys.readouterr().err


def test_benchmark_prints_one_json_line_and_keeps_the_given_flags(capsys):
    """--benchmark on the tiny preset: one JSON line with the figures the README reports; flags given on
    the command line (here a dropout of 0, equal to the tiny preset's) reach the timed model; the step
    is not traced again after warm-up; MFU is against --peak-tflops, the product-bound fraction against
    the measured product rate."""
    code = train_nmt.main(["--benchmark", "1", "--preset", "tiny", "--benchmark-sentences", "4",
                           "--attention-dropout", "0", "--activation-dropout", "0.2", "--peak-tflops", "0.001"])
    assert code == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["sentences"] == 4 and result["length"] == benchmark.BENCHMARK_LENGTH
    assert result["dropout"] == {"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.2}
    assert result["tgt_tokens_per_s"] > 0 and result["beam5_sentences_per_s"] > 0
    assert result["matmul_tflops_per_s"] > 0 and result["matmul_bound_tokens_per_s"] > 0
    assert result["retraced_after_warmup"] in (0, None)  # None: torch runs eagerly, nothing to trace
    tiny = {k: train_nmt.PRESETS["tiny"][k] for k in ("d_model", "ffn_dim", "encoder_layers", "decoder_layers")}
    assert result["flop_per_tgt_token"] * 4 * 32 == flops.train_flops(dict(tiny, vocab_size=200), 4, 32)
    tflops = result["tgt_tokens_per_s"] * result["flop_per_tgt_token"] / 1e12
    assert result["peak_basis"] == "--peak-tflops" and result["mfu"] == pytest.approx(tflops / 0.001, rel=1e-2)
    assert result["matmul_bound_fraction"] == pytest.approx(
        result["tgt_tokens_per_s"] / result["matmul_bound_tokens_per_s"], rel=1e-2)


def test_bpe_split_corpus_keeps_every_token_type(tmp_path, capsys):
    """fairseq-preprocess keeps every type of BPE-split text; only an explicit --vocab-size caps it, with a note."""
    rng = np.random.default_rng(0)
    words = [f"w{i}@@ x{i}" for i in range(1200)]  # 2,400 types: more than the old cap (max(256, distinct / 4))
    lines = [" ".join(rng.choice(words, 6)) for _ in range(400)]
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.de").write_text("\n".join(lines) + "\n")
        (tmp_path / f"{split}.en").write_text("\n".join(lines) + "\n")
    types = {t for line in lines for t in line.split()}
    args = train_nmt.parse_args(["--preset", "tiny", "--data-dir", str(tmp_path)])
    _, vocab, encoded = nmt_job.load_data(args.data, str(tmp_path / "cache"))
    assert vocab.joint and vocab.target.size == len(types) + 3
    assert not any(nmt_data.UNK in ids for pair in encoded["train"] for ids in pair)
    assert "every token type" in capsys.readouterr().out
    args = train_nmt.parse_args(["--preset", "tiny", "--data-dir", str(tmp_path), "--vocab-size", "1003"])
    _, vocab, _ = nmt_job.load_data(args.data, str(tmp_path / "cache"))
    assert vocab.target.size == 1003
    assert f"{len(types) - 1000} of the {len(types)} types become <unk>" in capsys.readouterr().out


def test_separate_dictionaries_keep_each_sides_types(tmp_path, capsys):
    """fairseq-preprocess without --joined-dictionary: a dictionary per side, each with every type of its side."""
    rng = np.random.default_rng(0)
    de_words, en_words = [f"d{i}@@ e{i}" for i in range(300)], [f"w{i}" for i in range(200)] + ["e1"]
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.de").write_text("\n".join(" ".join(rng.choice(de_words, 5)) for _ in range(300)) + "\n")
        (tmp_path / f"{split}.en").write_text("\n".join(" ".join(rng.choice(en_words, 5)) for _ in range(300)) + "\n")
    types = {lang: {t for line in (tmp_path / f"train.{lang}").read_text().splitlines() for t in line.split()}
             for lang in ("de", "en")}
    args = train_nmt.parse_args(["--preset", "tiny", "--data-dir", str(tmp_path), "--dictionaries", "separate"])
    _, vocab, encoded = nmt_job.load_data(args.data, str(tmp_path / "cache"))
    assert not vocab.joint
    assert (vocab.source.size, vocab.target.size) == (len(types["de"]) + 3, len(types["en"]) + 3)
    assert f"vocabularies {vocab.source.size} (de) and {vocab.target.size} (en)" in capsys.readouterr().out
    source, target = encoded["train"][0]
    line_de, line_en = (tmp_path / "train.de").read_text().splitlines()[0], (tmp_path / "train.en").read_text().splitlines()[0]
    assert [vocab.source.tokens[i] for i in source[:-1]] == line_de.split()  # each side by its own dictionary
    assert [vocab.target.tokens[i] for i in target] == line_en.split()
    model = nmt_job.build_model(args.model, vocab)
    assert model.source_embedding.embeddings.shape == (vocab.source.size, args.d_model)
    assert model.embedding.embeddings.shape == (vocab.target.size, args.d_model)  # decoder input = output
    assert train_nmt.parse_args(["--preset", "iwslt"]).dictionaries == "separate"  # fairseq's IWSLT'14 recipe
    assert train_nmt.parse_args([]).dictionaries == "joint"


def test_preset_and_schedule_defaults_follow_their_sources():
    iwslt = train_nmt.parse_args(["--preset", "iwslt"])
    assert (iwslt.dropout, iwslt.attention_dropout, iwslt.weight_decay) == (0.3, 0.0, 1e-4)  # fairseq's recipe
    assert train_nmt.parse_args([]).weight_decay == 0.0
    assert train_nmt.parse_args(["--preset", "iwslt", "--weight-decay", "0"]).weight_decay == 0.0
    assert train_nmt.parse_args(["--no-warmup"]).decay_factor == 0.1  # step: Section 4's x0.1
    assert train_nmt.parse_args(["--schedule", "decay_then_inverse_sqrt"]).decay_factor == 1.0  # 35.5-BLEU setting
    assert train_nmt.parse_args(["--schedule", "decay_then_inverse_sqrt", "--decay-factor", "0.5"]).decay_factor == 0.5


@pytest.mark.skipif(os.environ.get("KERAS_BACKEND") == "tensorflow", reason="TensorFlow's own lines belong to its runs")
def test_tensorflow_stays_out_of_jax_and_torch_runs():
    """Under jax and torch the scripts' backend check and seeding import no TensorFlow (3-10 s of start-up,
    and its CUDA and absl lines on the terminal), neither does Keras's seeding or serializing."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("tensorflow is not installed: nothing could import it")
    code = ("import sys; from harness import cli; import keras, schedules; assert cli.check_backend('t') is None; "
            "keras.utils.set_random_seed(1); a = keras.random.uniform((2,)); keras.utils.set_random_seed(1); "
            "assert (keras.ops.convert_to_numpy(a) == keras.ops.convert_to_numpy(keras.random.uniform((2,)))).all(); "
            "keras.saving.serialize_keras_object(schedules.make_schedule('inverse_sqrt', 1e-3, 10, 100)); "
            "print('tensorflow' in sys.modules)")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"})
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize("script, enumerations, flag, shown", [
    ("train_nmt", ("--preset", "--optimizer", "--schedule", "--dictionaries", "--corpus", "--sweep", "--distribute",
                   "--precision"), "--d-model",
     "[preset: cpu 128, iwslt 512, wmt14 512, tiny 32]"),
    ("pretrain_bert", ("--preset", "--recipe", "--optimizer", "--activation", "--initializer", "--sweep", "--finetune",
                       "--distribute", "--precision"),
     "--d-model", "[preset: base 768, cpu 128, tiny 32]"),
    ("analyze_grads", ("analysis", "--preset", "--corpus", "--loss"), "--depths",
     "[preset: cpu 2,4,6,8, paper 6,8,10,12,14, tiny 1,2]"),
])
def test_every_flag_has_help_and_enumerations_have_choices(script, enumerations, flag, shown):
    """Every flag of the three scripts says what it does; those a preset sets show their value at every
    preset; enumerations are argparse choices (and the placements are layers.NORMS)."""
    import importlib

    from layers import NORMS

    module = importlib.import_module(script)
    parser = module.build_parser()
    flags = [a for a in parser._actions if a.dest != "help"]
    assert [a.option_strings[0] if a.option_strings else a.dest for a in flags if not a.help] == []
    if "--norm" in parser._option_string_actions:
        assert tuple(parser._option_string_actions["--norm"].choices) == tuple(NORMS)
    by_name = {a.option_strings[0] if a.option_strings else a.dest: a for a in flags}
    for name in enumerations:
        assert by_name[name].choices, name
    preset_set = set(next(iter(module.PRESETS.values())))
    assert [a.dest for a in flags if a.dest in preset_set and "[preset: " not in a.help] == []
    assert shown in by_name[flag].help


def test_fairseq_names_are_accepted_as_aliases():
    """fairseq's --max-update, --warmup-updates, --max-epoch and --save-dir mean what they mean there."""
    spec = train_nmt.parse_args(["--max-update", "7", "--warmup-updates", "3", "--max-epoch", "2", "--save-dir", "x"])
    assert (spec.max_updates, spec.warmup_steps, spec.epochs, spec.out) == (7, 3, 2, "x")
    assert spec == train_nmt.parse_args(["--max-updates", "7", "--warmup-steps", "3", "--epochs", "2", "--out", "x"])
    shown = train_nmt.build_parser().format_help()
    assert all(name in shown for name in ("--max-update ", "--warmup-updates", "--max-epoch", "--save-dir"))


def test_eval_only_takes_a_run_folder_and_its_own_data_settings(trained_run, tmp_path):
    """--eval-only RUN, with no data flags: the run's newest checkpoint on the data and vocabulary it trained
    on (its config.json), giving the test scores the run wrote with the same decoding flags, in RUN/eval.json."""
    out = trained_run()
    done = train_nmt.main(["--eval-only", str(out), "--beam", "2", "--max-len-b", "20"])
    assert done == 0
    ran, evaluated = (json.loads((out / name).read_text()) for name in ("results.json", "eval.json"))
    assert (evaluated["test_bleu"], evaluated["test_sentences"]) == (ran["test_bleu"], ran["test_sentences"])
    assert train_nmt.main(["--eval-only", str(tmp_path)]) == 2  # not a run: one line
