"""One run of a sweep or of reproduce.py in a process of its own (reproduction/sweeps.py starts it):

    python -m reproduction.worker JOB RUN_DIR FLAGS     # JOB: translation, bert, finetune or analysis

FLAGS is the JSON of the run's given values (`spec.flags()`), from which the worker builds the same spec
again (harness/specs.py); the run writes RUN_DIR. Two values name another run's files before they
exist, and are read here as the run starts: a BERT `vocab` of "@RUN" is that run's tokenizer (a sweep's
later runs share its first run's WordPiece vocabulary), and an `init` entry "@RUN" is that run's newest
checkpoint (MRPC fine-tunes Figure 5(a)'s final checkpoints).
"""

import json
import sys

from harness.cli import run_script
from harness.rundir import RunDir
from harness.specs import AnalysisSpec, BertSpec, TranslationSpec

SPECS = {"translation": TranslationSpec, "bert": BertSpec, "finetune": BertSpec, "analysis": AnalysisSpec}


def build_spec(job, flags):
    """The spec of a run from its JOB and FLAGS, "@RUN" values read from those runs' directories."""
    values = json.loads(flags)
    if str(values.get("vocab", "")).startswith("@"):
        first = RunDir(values["vocab"][1:])
        values["vocab"] = first.file(first.config()["tokenizer"])
    if values.get("init"):
        values["init"] = [RunDir(path[1:]).state()["checkpoint"] if path.startswith("@") else path
                          for path in values["init"]]
    return SPECS[job].build(**values)


def run(job, spec):
    """The run of a script, as the script itself runs it: train_nmt.py's `train(spec, out)`, pretrain_bert.py's
    `pretrain`, analyze_grads.py's `analyze`, or --finetune's `glue.run` (its Keras side, imported here:
    harness/cli.py says why)."""
    if job == "translation":
        import train_nmt  # each script imports its Keras side inside its run

        return train_nmt.train(spec, spec.out)
    if job == "bert":
        import pretrain_bert

        return pretrain_bert.pretrain(spec, spec.out)
    if job == "analysis":
        import analyze_grads

        return analyze_grads.analyze(spec, spec.out)
    from harness import glue  # fine-tuning's Keras side

    return glue.run(spec, spec.out)


def main(argv=None):
    job, run_dir, flags = sys.argv[1:] if argv is None else argv
    if job not in SPECS:
        print(f"reproduction.worker: error: unknown job {job!r}; choose from {', '.join(SPECS)}", file=sys.stderr)
        return 2
    return run_script(f"{job} run {run_dir}", [], lambda _: build_spec(job, flags), lambda spec: None,
                      lambda spec: run(job, spec))


if __name__ == "__main__":
    sys.exit(main())
