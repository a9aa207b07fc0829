"""IWSLT14-style translation with Post-LN, Pre-LN or DeepNorm: the warmup experiments (Figures 2 and 4).

    KERAS_BACKEND=jax python train_nmt.py --norm pre --no-warmup         # minutes on a CPU, default data
    KERAS_BACKEND=jax python train_nmt.py --norm post --sweep fig2       # Figure 2 at CPU scale
    python train_nmt.py --prepare-iwslt14 de-en.tgz --data-dir data/iwslt14 --preset iwslt --norm post
    python train_nmt.py --prepare-wmt14 wmt14-archives/ --data-dir data/wmt14 --preset wmt14 --norm pre --no-warmup

Xiong et al. 2020: Post-LN needs the learning-rate warmup (Section 3.2, Figure 2); Pre-LN trains
without it (Section 4, Figure 4). Each run writes runs/NAME/{config.json, metrics.csv, checkpoints/,
results.json, curves.png}; a sweep writes one directory per run and an overlay plot.

This file holds the run, top to bottom (`train`: data, model, compile, fit, test), and its command line
(flags, presets, checks, modes, sweeps). Keras is imported inside `train` and the other modes, once the
command line is checked, so that --help and a refusal need no backend; the functions `train` calls, each
named for what it does, are harness/nmt_job.py's.
"""

import argparse
import os
import sys
import time

from harness.cli import (
    Command,
    Mode,
    check_modes,
    given_flags,
    refuse_warmup_clash,
    resumed_flags,
    run_script,
    spec_parser,
)
from harness.console import UsageError
from harness.files import CONFIG, check_run_path
from harness.specs import SWEEPS, TranslationSpec, comma_names, int_list, setting

PRESETS = TranslationSpec.PRESETS  # each value with its source: harness/specs.py


# --- the run --------------------------------------------------------------------------------------

def train(spec, out):
    """A training run of the spec `spec` (this command line's, or one run of an experiment) in the run
    directory `out`, top to bottom: data, model, compile, fit, test. The devices are those
    `devices.configure` picks, with the process-wide settings for speed (`devices.tune_runtime`); the
    helpers it calls take the spec's parts (harness/nmt_job.py). --translate, --eval-only and --benchmark
    are modes of their own (`run`)."""
    import keras  # the Keras side, imported once run_script has checked KERAS_BACKEND (harness/cli.py says why)

    from harness import devices, nmt_data, nmt_job
    from harness.devices import compile_clock
    from harness.callbacks import EpochBatches, Run
    from harness.plots import plot_runs
    from harness.files import chief_first
    from harness.rundir import RunDir

    devices.tune_runtime()
    name, setup = spec.name(), devices.configure(spec.devices)
    with setup.scope(), compile_clock() as compiling:
        started = time.time()
        run_dir = RunDir.start(out, spec.resume, unit="epoch")
        if spec.resume:
            run_dir.refuse_ended(run_dir.updates_asked(spec.epochs, spec.max_updates))
        # A resumed run keeps its batches (runs from before packing had the grid's); a new one packs them.
        batching = spec.batching or (run_dir.config().get("batching") or "grid" if spec.resume else "packed")
        keras.utils.set_random_seed(spec.seed)
        corpus, vocab, data = chief_first(lambda: nmt_job.load_data(spec.data, run_dir.vocab))
        plan = nmt_job.Plan(spec.data, spec.training, spec.optimization, data, batching)
        model, start = nmt_job.start_model(spec.resume, spec.model, spec.optimization, run_dir, setup, plan, vocab)
        if not spec.resume:
            nmt_job.record_config(spec.config(), run_dir, setup, plan, corpus, vocab)
        print(f"{name}: {model.count_params():,} parameters, {plan.updates_per_epoch} updates per epoch; "
              f"{setup.description}, {spec.precision}; run directory {run_dir.path}")
        if spec.preset == "cpu" and not spec.data_dir:
            print("hint: --preset iwslt --data-dir DIR trains the paper's model on IWSLT14 (a GPU is advised)")
        setup.build(model, plan.probe_batch)
        greedy_step = nmt_job.beam_step(model, 1, spec.unkpen)  # validation BLEU decodes greedily each epoch: compile once
        run = Run(start.updates, start.rows, stop=spec.max_updates or None, loss_state=start.loss_state,
                  seed=spec.seed)
        metrics = nmt_job.Metrics(spec.data, spec.decoding, run, run_dir, plan, setup, corpus, vocab, data["valid"],
                                  greedy_step)
        # The batch order of each epoch is a function of (--seed, epoch); a resumed epoch skips what was trained.
        dataset = EpochBatches(lambda epoch: nmt_data.batch_examples(data["train"], spec.max_tokens, plan.batching,
                                                                     seed=spec.seed * 100003 + epoch),
                               plan.updates_per_epoch, start.epoch, skip=start.skip, pad=setup.feed,
                               pad_id=nmt_data.PAD)
        callbacks = nmt_job.make_callbacks(spec.training, run, run_dir, plan, metrics, dataset)
        nmt_job.fit_epochs(model, dataset, run, callbacks, spec.epochs, start)
        result = nmt_job.summary(spec.model, spec.optimization, spec.training, name, run, run_dir, corpus)
        if run.outcome != "diverged":
            result.update(nmt_job.test(model, corpus, vocab, data["test"], spec.data, spec.decoding,
                                       greedy_step if spec.beam == 1 else None))
        result.update(nmt_job.compile_report(compiling.seconds, time.time() - started, compiling.programs))
        plot_runs({name: run.rows}, run_dir.file("curves.png"))
        run_dir.write_results(result)  # last: a run with results.json is done, its files all written
        return result


# --- command line ---------------------------------------------------------------------------------

def _name_list(text):
    names = comma_names(text)
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names no run; give comma-separated run names, e.g. "
                                         "post-warmup-lr1e-3,post-nowarmup-lr1e-3")
    return names


# The sweep's own flags (`cli.Command`), which no run's spec holds; --help lists them after --resume.
SWEEP_FLAGS = dict(
    sweep=setting(group="runs", choices=SWEEPS, help="run one of the papers' comparisons (reproduction/experiments.py): "
                  "fig2, fig4 or depth; one run directory each under --out, a results table and plots"),
    runs=setting(group="runs", type=_name_list, metavar="NAME,...",
                 help="--sweep: only these runs of the sweep's plan (default all; the names are its run directories)"),
    depths=setting(group="runs", type=int_list, metavar="L,L,...",
                   help="--sweep depth: layers per stack (default: cpu 6,12; iwslt and wmt14 6,12,24,48)"),
    jobs=setting(group="runs", type=int,
                 help="--sweep: runs at a time, each in its own process with cores / jobs threads (default 1)"),
)


def build_parser():
    """The command line: the flags of `TranslationSpec`'s fields (harness/specs.py), and the sweep's."""
    return spec_parser(TranslationSpec, "train_nmt.py", __doc__, after={"resume": SWEEP_FLAGS})


def parse_command(argv=None):
    """The command line as a `cli.Command`: the run's spec, built once, and the sweep's own flags."""
    given = given_flags(build_parser, argv)
    sweep = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if k in SWEEP_FLAGS}
    given = {k: v for k, v in given.items() if k not in SWEEP_FLAGS}
    if "sweep" not in sweep:  # --resume goes on with the run's own settings (docs/translation.md)
        given = resumed_flags(TranslationSpec, given, default_out(Command(TranslationSpec.build(**given))))
    return Command(TranslationSpec.build(**given), **sweep)


def parse_args(argv=None):
    """The spec of the run the command line describes (`TranslationSpec`), without a sweep's own flags."""
    return parse_command(argv).spec


# One mode per command line: besides training, these (their own flags, and the others each takes).
DECODING_FLAGS = ("beam", "lenpen", "max_len_a", "max_len_b", "min_len", "unkpen")
COMMAND_MODES = {
    "sweep": Mode("--sweep", ("runs", "depths", "jobs")),
    "translate": Mode("--translate", ("input",), DECODING_FLAGS,
                      "takes the run's own settings and only decoding flags"),
    "eval_only": Mode("--eval-only", (), DECODING_FLAGS + ("preset", "corpus", "data_dir", "src", "tgt", "vocab_size",
                                                         "dictionaries", "max_tokens", "test_sentences", "seed"),
                      "takes the model from its checkpoint and only data and decoding flags"),
    "benchmark": Mode("--benchmark", ("benchmark_sentences", "peak_tflops"),
                      ("preset", "norm", "deepnorm_rule", "qkv_init", "vocab_size", "d_model", "ffn_dim", "heads",
                       "encoder_layers", "decoder_layers", "dropout", "attention_dropout", "activation_dropout",
                       "optimizer", "lr", "weight_decay", "clip_norm", "label_smoothing", "seed"),
                      "times train steps of one model: only model and optimizer flags"),
}


def check_mode(command):
    """Refuse, with one line, a command line that asks for two modes (train, --sweep, --translate,
    --eval-only, --benchmark), a flag of a mode it does not ask for, two flags that contradict, or a path to
    read (--input, --translate, --eval-only) that is not there."""
    spec, given = command.spec, set(command.spec.given)
    given |= {dest for dest, value in (("runs", command.runs), ("depths", command.depths)) if value}
    given |= {"sweep"} if command.sweep else set()
    given |= {"jobs"} if command.jobs != 1 else set()
    check_modes(COMMAND_MODES, given, [d for d in COMMAND_MODES if d in given and (d != "benchmark" or spec.benchmark)])
    if "depths" in given and command.sweep != "depth":
        raise UsageError(f"--depths sets the depths of --sweep depth, not of --sweep {command.sweep}")
    if "wmt14_valid" in given and not spec.prepare_wmt14:
        raise UsageError("--wmt14-valid chooses --prepare-wmt14's validation set; add --prepare-wmt14 ARCHIVE_DIR")
    if spec.prepare_iwslt14 and spec.prepare_wmt14:
        raise UsageError("--prepare-iwslt14 and --prepare-wmt14 both write --data-dir; pass one of them")
    refuse_warmup_clash(spec.optimization)
    if spec.input and not os.path.isfile(spec.input):
        raise UsageError(f"--input {spec.input}: no such file; pass a text file with one sentence a line")
    for flag, path in (("--translate", spec.translate), ("--eval-only", spec.eval_only)):
        if path:
            check_run_path(path, flag)


def check_args(command):
    """Refuse bad settings with one line (`UsageError`) before any work; `command` is a `cli.Command` or a spec."""
    if isinstance(command, TranslationSpec):
        command = Command(command)
    else:  # a command line, not one of a sweep's runs: one mode, and no flag that contradicts another
        check_mode(command)
    args = command.spec
    if command.runs:
        from reproduction.experiments import sweep_runs  # the papers' comparisons: a sweep's alone

        names = [run.name for run in sweep_runs(command.sweep, args, command.depths)]
        unknown = [name for name in command.runs if name not in names]
        if unknown:
            raise UsageError(f"--runs {','.join(unknown)}: not in the {command.sweep} sweep at --preset {args.preset}; "
                             f"choose from {', '.join(names)}")
    if command.jobs < 1:
        raise UsageError(f"--jobs must be a positive number of runs at a time, got {command.jobs}")
    args.check()  # each setting's range, and those that must agree (specs.TranslationSpec.check)


# --- sweeps and runs ------------------------------------------------------------------------------

def sweep(command):
    """--sweep NAME: the experiment's runs (`experiments.sweep_runs`), one run directory each under the
    sweep's directory, then its table and plots (`sweeps.run_sweep`)."""
    from reproduction.experiments import sweep_runs  # the papers' comparisons: a sweep's alone

    runs = sweep_runs(command.sweep, command.spec, command.depths)
    if command.runs:  # names checked by check_args
        runs = tuple(run for run in runs if run.name in command.runs)
    for run in runs:
        check_args(run.spec)  # every run's settings are checked before the first one starts
    from reproduction.sweeps import run_sweep  # the runner (Ray): a sweep's alone

    return run_sweep("translation", command.sweep, runs, default_out(command), command.jobs, command.spec.resume)


def run(command):
    """What the command line asks for: a sweep, --benchmark, --translate, --eval-only, or a training run
    (`train`). Each mode's Keras side is imported here, once run_script has checked KERAS_BACKEND,
    so that --help and the rest of this file need no backend; the training path imports none of the others."""
    spec = command.spec
    if spec.prepare_iwslt14 or spec.prepare_wmt14:  # the corpus first, once, by the chief of several processes
        from harness.files import chief_first

        chief_first(lambda: prepare_corpus(spec.data))
    if command.sweep:
        return sweep(command)
    if spec.benchmark:
        from harness.benchmark import benchmark

        return benchmark(spec, PRESETS)
    if spec.translate or spec.eval_only:
        from harness import devices, translate

        devices.tune_runtime()
        if spec.translate:
            return translate.translate_stream(spec.translate, spec.input, spec.decoding)
        return eval_only(spec.eval_only, spec.data, spec.decoding)
    return train(spec, default_out(command))


def prepare_corpus(data):
    """--prepare-iwslt14 or --prepare-wmt14 ARCHIVE into --data-dir (the spec's data part `data`), unless it
    holds the six files of a prepared corpus already; the run then reads them as any --data-dir."""
    prepared = all(os.path.exists(os.path.join(data.data_dir, f"{split}.{lang}")) for split in ("train", "valid", "test")
                   for lang in (data.src, data.tgt))
    if not prepared and data.prepare_iwslt14:
        from harness import iwslt14  # corpus preparation: not on the training path

        iwslt14.prepare_iwslt14(data.prepare_iwslt14, data.data_dir, src=data.src, tgt=data.tgt)
    elif not prepared:
        from harness import wmt14

        wmt14.prepare_wmt14(data.prepare_wmt14, data.data_dir, valid=data.wmt14_valid)


RUN_SETTINGS = ("corpus", "data_dir", "src", "tgt", "vocab_size", "max_tokens", "test_sentences")  # --eval-only


def eval_only(path, data_settings, decoding):
    """--eval-only RUN_OR_CHECKPOINT (`path`): test BLEU of a run's newest checkpoint (or of the checkpoint
    given) on the data the run trained on: its settings in config.json, less those the command line gives
    (the data part `data_settings`), decoded as the decoding part says.
    Written to RUN/eval.json."""
    from harness.nmt_job import load_data, test
    from harness.translate import translation_checkpoint

    model, run_dir, checkpoint = translation_checkpoint(path, "--eval-only")
    ran = run_dir.config() if os.path.isfile(run_dir.file(CONFIG)) else {}  # a checkpoint moved out of its run: none
    data_settings = data_settings.but(**{k: ran[k] for k in RUN_SETTINGS if k in ran and k not in data_settings.given})
    config = model.get_config()
    dictionaries = "joint" if config.get("source_vocab_size") is None else "separate"  # the checkpoint's own
    corpus, vocab, data = load_data(data_settings, run_dir.vocab, dictionaries)
    sizes = (config["vocab_size"], config.get("source_vocab_size") or config["vocab_size"])
    if (vocab.target.size, vocab.source.size) != sizes:
        raise UsageError(f"{checkpoint} has a vocabulary of {sizes[0]} but the data gives "
                         f"{vocab.target.size}; pass the --data-dir and --vocab-size it was trained with"
                         if sizes[0] != vocab.target.size else
                         f"{checkpoint} has a source vocabulary of {sizes[1]} but the data gives {vocab.source.size}; "
                         "pass the --data-dir and --vocab-size it was trained with")
    result = test(model, corpus, vocab, data["test"], data_settings, decoding)
    run_dir.write_json("eval.json", result)
    return result


def default_out(command):
    """The directory a command writes: --out, or one under runs/ named after the job."""
    spec = command.spec
    return spec.out or os.path.join("runs", f"sweep-{command.sweep}-{spec.preset}" if command.sweep else spec.name())


def training(command):
    """Whether the command line is a training run (no sweep and no other mode)."""
    spec = command.spec
    return not (spec.benchmark or spec.eval_only or command.sweep or spec.translate)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_script("train_nmt.py", argv, parse_command, check_args, run,
                      out_dir=lambda c: default_out(c) if training(c) else None,
                      claim=lambda c: training(c) and (default_out(c), c.spec.resume, "epoch",
                                                       lambda run_dir: run_dir.updates_asked(c.spec.epochs,
                                                                                             c.spec.max_updates)))


if __name__ == "__main__":
    sys.exit(main())
