"""BERT masked-LM pretraining: Post-LN with warmup against Pre-LN without warmup (Figure 5), and GLUE fine-tuning.

    KERAS_BACKEND=torch python pretrain_bert.py --sweep fig5                  # Figure 5(a) at CPU scale
    KERAS_BACKEND=torch python pretrain_bert.py --recipe pre-no-warmup        # one run, default corpus
    python pretrain_bert.py --preset base --corpus wiki/ books/ --recipe post-warmup   # the paper (GPUs)
    python pretrain_bert.py --finetune mrpc --glue-dir glue/ --init runs/fig5/post-warmup runs/fig5/pre-no-warmup

Xiong et al. 2020, Section 4: Post-LN BERT needs 10k warmup updates to lr 1e-4 (at 3e-4 it diverges);
Pre-LN trains from lr 3e-4 with no warmup, both with linear decay, and reaches Post-LN's validation
loss 40 % sooner (Figure 5(a)); fine-tuned on MRPC and RTE its checkpoints are ahead too (Figure 5(b, c)).
A run writes runs/NAME/{config.json, metrics.csv, checkpoints/stepN.keras, state.json, results.json,
curves.png, vocab/}; a sweep one directory per recipe and an overlay plot; fine-tuning results.csv.
"""

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
from harness.console import UsageError, check_warmup
from harness.specs import BERT_SWEEPS, BertSpec, setting

PRESETS = BertSpec.PRESETS  # each value with its source: harness/specs.py


# --- the run --------------------------------------------------------------------------------------

def pretrain(spec, out):
    """One pretraining run of the spec `spec` (this command line's, or one run of an experiment) in the run
    directory `out` (continued with --resume), top to bottom: data, model, compile, fit; named by its recipe
    (`spec.name()`) in plots and results.json. The devices are those `devices.configure` picks; the helpers it
    calls take the spec's parts (harness/bert_job.py). --finetune is a mode of its own (`glue.run`)."""
    import keras  # the Keras side, imported once run_script has checked KERAS_BACKEND (harness/cli.py says why)
    import numpy as np

    from harness import bert_data, bert_job, devices
    from harness.callbacks import Run, StepBatches, fit
    from harness.plots import bert_loss_panels, plot_panels
    from harness.files import chief_first
    from harness.rundir import RunDir
    from schedules import make_schedule

    data, optimization, training, resume, name = spec.data, spec.optimization, spec.training, spec.resume, spec.name()
    devices.tune_runtime()
    setup = devices.configure(spec.devices)
    if training.batch_size % setup.replicas:
        raise UsageError(f"--batch-size {training.batch_size} must be a multiple of the {setup.replicas} "
                         "data-parallel replicas; change it or --distribute")
    with setup.scope():
        run_dir = RunDir.start(out, resume, unit="step")
        original = run_dir.config() if resume else dict(steps=optimization.steps)
        stop = min(optimization.steps, training.max_updates) if training.max_updates else optimization.steps
        if resume:
            run_dir.refuse_ended(stop)
        if original["steps"] != optimization.steps:
            raise UsageError(f"--resume: {out} was started with --total-updates {original['steps']}; resume with the "
                             "same flags (--max-updates stops a run early)")
        # BERT's recipes (Section 4): Post-LN warms up, then decays linearly to 0; Pre-LN decays from update 1
        check_warmup(optimization.warmup, optimization.steps, longer="--total-updates")
        schedule = make_schedule("linear", optimization.lr, optimization.warmup, optimization.steps)
        keras.utils.set_random_seed(training.seed)
        vocab_file = run_dir.file(original["tokenizer"]) if resume else data.vocab  # a resumed run keeps its own
        loaded = chief_first(lambda: bert_job.load_data(data, training, run_dir.vocab, vocab_file))
        model, start = bert_job.start_model(resume, spec.model, data, optimization, run_dir, setup, schedule,
                                            loaded["vocab_size"])
        if not resume:
            run_dir.write_config(spec.config(), dict(
                data=loaded["description"], vocab_size=loaded["vocab_size"], run_dir=run_dir.path,
                tokenizer=os.path.relpath(loaded["tokenizer_path"], run_dir.path), parameters=model.count_params(),
                schedule=keras.saving.serialize_keras_object(schedule)), setup)
        print(f"{name}: {model.count_params():,} parameters, {optimization.steps} updates of {training.batch_size} "
              f"sequences; {setup.description}, {spec.precision}; run directory {run_dir.path}")
        run = Run(start.updates, start.rows, outcome="finished" if stop == optimization.steps else "stopped", stop=stop,
                  loss_state=start.loss_state, seed=training.seed)
        run.started = time.time() - start.elapsed_s

        def batch_of(step):  # the batch of update step + 1, a function of (--seed, step)
            return bert_job.training_batch(data, training, loaded["train"], loaded["vocab_size"], step)

        setup.build(model, batch_of(start.updates))
        metrics = bert_job.Metrics(run, run_dir, schedule, loaded["valid"], setup)
        # A resumed run goes on with the batch of the next update.
        dataset = StepBatches(batch_of, start.updates, stop, pad=setup.feed,
                              count_tokens=lambda batch: int(np.sum(batch[0]["token_ids"] != bert_data.PAD)))
        fit(model, dataset, run, epochs=1,
            callbacks=bert_job.make_callbacks(training, run, run_dir, schedule, metrics, dataset, stop))
        result = bert_job.summary(spec.model.norm, optimization, name, run, run_dir, loaded)
        if training.patience:  # the converged protocol: the update of its plateau, or None at the cap
            result["plateau_at"] = run.plateau_at
        plot_panels(run_dir.file("curves.png"), "updates", bert_loss_panels({name: run.rows}))
        run_dir.write_results(result)  # last: a run with results.json is done, its files all written
        return result


# --- command line ---------------------------------------------------------------------------------

# The sweep's own flag (`cli.Command`), which no run's spec holds; --help lists it after --resume.
SWEEP_FLAG = dict(sweep=setting(group="runs", choices=BERT_SWEEPS, help="fig5: Figure 5(a)'s two recipes (at the cpu "
                                "preset each at the four rates of its protocol, results/protocols.md), an overlay plot "
                                "and the speed-up"))


def build_parser():
    """The command line: the flags of `BertSpec`'s fields (harness/specs.py), and --sweep."""
    return spec_parser(BertSpec, "pretrain_bert.py", __doc__, after={"resume": SWEEP_FLAG})


def parse_command(argv=None):
    """The command line as a `cli.Command`: the run's spec, built once, and --sweep."""
    given = given_flags(build_parser, argv)
    sweep = given.pop("sweep", None)
    if sweep is None:  # --resume goes on with the run's own settings (docs/bert.md)
        given = resumed_flags(BertSpec, given, default_out(BertSpec.build(**given)))
    return Command(BertSpec.build(**given), sweep)


def parse_args(argv=None):
    """The spec of the run the command line describes (`BertSpec`: presets and the recipe resolved)."""
    return parse_command(argv).spec


# Besides pretraining, two modes: --sweep, and --finetune, which takes the rest from the pretraining checkpoints.
COMMAND_MODES = {
    "sweep": Mode("--sweep"),
    "finetune": Mode("--finetune mrpc|rte", ("glue_dir", "init", "seeds", "epochs"),
                     ("lr", "batch_size", "seed", "seq_len", "preset", "out"), "takes the model from --init"),
}


def check_mode(command):
    """Refuse, with one line, a command line that mixes pretraining, --sweep and --finetune, or gives
    two flags that contradict."""
    check_modes(COMMAND_MODES, set(command.spec.given) | ({"sweep"} if command.sweep else set()))
    refuse_warmup_clash(command.spec.optimization)


def check_args(command):
    """Refuse bad settings with one line (`UsageError`) before any work; `command` is a `cli.Command` or a spec."""
    if isinstance(command, Command):
        check_mode(command)
    args = command.spec if isinstance(command, Command) else command
    args.check()  # each setting's range, and those that must agree (specs.BertSpec.check)


# --- running --------------------------------------------------------------------------------------

def run(command):
    """What the command line asks for: --sweep fig5 (its runs each in a process of its own,
    `reproduction.sweeps`), --finetune (harness/glue.py), or one pretraining run (`pretrain`). Each
    imports its Keras side once run_script has checked KERAS_BACKEND, so that --help and the rest of this file
    need no backend."""
    if command.sweep:
        from reproduction.experiments import bert_sweep_runs  # the papers' comparisons: a sweep's alone

        runs = bert_sweep_runs(command.sweep, command.spec)
        for run in runs:
            check_args(run.spec)
        from reproduction.sweeps import run_sweep  # the runner (Ray): a sweep's alone

        return run_sweep("bert", command.sweep, runs, default_out(command), 1, command.spec.resume)
    if command.spec.finetune:  # a mode of its own, which pretraining does not import
        from harness import glue

        return glue.run(command.spec, default_out(command))
    return pretrain(command.spec, default_out(command))


def default_out(command):
    """The directory a command writes: --out, or one under runs/ named after the job."""
    args = command.spec if isinstance(command, Command) else command
    sweep = command.sweep if isinstance(command, Command) else None
    return args.out or os.path.join("runs", f"finetune-{args.finetune}" if args.finetune else
                                    f"sweep-{sweep}-{args.preset}" if sweep else args.name())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_script("pretrain_bert.py", argv, parse_command, check_args, run, out_dir=default_out,
                      claim=lambda c: not (c.sweep or c.spec.finetune) and (
                          default_out(c), c.spec.resume, "step", lambda run_dir: min(c.spec.steps,
                                                                                     c.spec.max_updates or c.spec.steps)))


if __name__ == "__main__":
    sys.exit(main())
