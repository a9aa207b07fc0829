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
from harness.constants import BERT_SWEEPS
from harness.errors import UsageError
from harness.specs import BertSpec, setting

PRESETS = BertSpec.PRESETS  # each value with its source: harness/specs.py


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
    `reproduction.sweeps`), --finetune (harness/glue.py), or one pretraining run on the Keras side
    (harness/bert_job.py). Each is imported here: once run_script has checked KERAS_BACKEND, so that --help
    and the rest of this file need no backend."""
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
    from harness import bert_job  # the one import of the Keras side inside a function (harness/cli.py says why)

    return bert_job.run(command.spec, default_out(command))


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
