"""Re-measure the README's Results table with one command: every experiment, its rule, its files.

    python reproduce.py --plan                 # the experiments, each with its time, and the total
    python reproduce.py                        # all of them, on this machine's cores; then the tables and verdicts
    python reproduce.py --address head:6379    # the same runs spread over a running Ray cluster
    python reproduce.py --only main,fig4       # chosen experiments (the Results table's rows they judge)
    python reproduce.py --smoke                # every experiment's whole pipeline at the tiny size, minutes
    python reproduce.py --glue-dir glue/       # with GLUE MRPC (not shipped) for Figure 5(b, c)
    python reproduce.py --hours 3              # start no run that would end after 3 hours; again to go on
    python reproduce.py --certify              # prove today's code gives the measured numbers (reproduction/certify.py)

Each experiment (reproduction/experiments.py) is a list of runs, the rows of the Results table that judge
them (reproduction/tables.py holds their rules) and its results/ folder. Each run is a Ray task that trains in
a process of its own (reproduction/runner.py), on a local Ray instance of this machine's cores or on the
cluster at --address, in run directories under --runs-dir; as an experiment's last run ends, what the
table reads is written into results/ and each run's wall time into results/FOLDER/timing.json, which the
next plan reads. Then the generated tables (README.md, the results pages) are rewritten and the verdicts
printed. Run the same command again after an interruption: finished runs are kept, a stopped run goes on
from its last checkpoint (to go on elsewhere, take --runs-dir along). --smoke writes its runs and
results under runs/reproduce-smoke/ and leaves results/ and the README as they are.
"""

import argparse
import contextlib
import importlib.util
import math
import os
import sys
import tempfile
import time

from harness.cli import first_missing
from harness.console import OneLineParser, UsageError
from reproduction import certify as check, tables
from reproduction.campaign import (cannot_run, hours, make_plan, only_one, print_gpu_plan, print_plan, reproduce,
                                  verdicts, wall_minutes, what_is_left, with_needs)
from reproduction.experiments import EXPERIMENTS
from reproduction.runner import Engine, stop_on_sigterm

ROOT = os.path.dirname(os.path.abspath(__file__))
MAX_SLOTS = 10_000  # runs at a time: more than any cluster this project's runs would fill


def build_parser():
    p = OneLineParser(prog="reproduce.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", metavar="NAME,...", help=f"only these experiments, of {', '.join(EXPERIMENTS)} "
                   "(default: all)")
    p.add_argument("--plan", action="store_true", help="print the plan (experiments, times, total) and exit")
    p.add_argument("--smoke", action="store_true", help="every experiment at the tiny size (the pipeline end to "
                   "end in minutes); its runs and results go under --runs-dir, not results/")
    p.add_argument("--hours", type=float, metavar="H", help="start no run that the plan expects to end after H "
                   "hours from now; ends when the runs started have, and the same command goes on next time")
    p.add_argument("--slots", "--jobs", type=int, dest="slots", metavar="N",
                   help="at most N runs at a time (default: as many as the Ray instance's CPUs, or GPU shares, hold: "
                        "each run takes the kernel threads its results were measured with, 1 on these CPUs)")
    p.add_argument("--address", metavar="HOST:PORT", help="run on the Ray cluster there (default: RAY_ADDRESS, else a "
                   "local Ray instance of this machine); --runs-dir must be a folder every node sees, at the same path")
    p.add_argument("--gpu-share", type=float, default=0.25, metavar="F",
                   help="on a cluster with GPUs, the share of one GPU each run takes, so 1/F runs share a GPU, and "
                        "the share of its memory jax preallocates (default 0.25)")
    p.add_argument("--glue-dir", metavar="DIR", help="GLUE MRPC (train.tsv and dev.tsv, or a folder holding MRPC/), "
                   "for Figure 5(b, c); without it that experiment is skipped")
    p.add_argument("--backend", choices=("jax", "tensorflow", "torch"),
                   help="run every experiment on this Keras backend (default: each on the one its results were "
                        "measured on: jax, and torch for BERT; another backend draws other random numbers)")
    p.add_argument("--certify", action="store_true",
                   help="run the numerics check (reproduction/certify.py, about 6 min) on today's code; if it gives the "
                        "outputs of the code the Results table was measured on, bit for bit, and every statement "
                        "changed since then ran in it, record today's code as equivalent (results/certify/), "
                        "so that the rows stay current; else name what differs and exit 1")
    p.add_argument("--runs-dir", metavar="DIR", help="where the run directories go (default runs/reproduce, "
                   "or runs/reproduce-smoke with --smoke)")
    return p


def selected(only, smoke):
    """The experiments of --only (by default all but those sized for GPUs, which run by name; with --smoke
    all), each at the tiny size with --smoke; one line for a bad name."""
    names = [name for name, e in EXPERIMENTS.items() if smoke or e.hardware != "gpu"] if only is None else \
        [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown or not names:
        raise UsageError(f"--only {','.join(unknown) or repr(only)}: no such experiment; choose from "
                         f"{', '.join(EXPERIMENTS)}")
    experiments = [EXPERIMENTS[n] for n in names]
    return [e.smoke() for e in experiments] if smoke else experiments


def writable(runs_dir, make=True):
    """Refuse, in one line, a runs folder that is a file, or (with `make`) that this process cannot make or
    write in."""
    if os.path.exists(runs_dir) and not os.path.isdir(runs_dir):
        raise UsageError(f"--runs-dir {runs_dir}: a file, not a folder; pass a folder")
    if not make:
        return
    try:
        os.makedirs(runs_dir, exist_ok=True)
        with tempfile.TemporaryFile(dir=runs_dir):
            pass
    except OSError as error:
        raise UsageError(f"--runs-dir {runs_dir}: cannot write there ({error.strerror or error}); pass a folder "
                         "you can write") from None


def certify():
    """--certify: the numerics check of today's code (reproduction/certify.py); exit code 1 when it refuses."""
    started = time.time()
    try:
        made = check.certify(ROOT)
    except check.Refused as refusal:
        print(f"reproduce.py: not certified: {refusal}", file=sys.stderr)
        return 1
    except check.CheckError as error:
        print(f"reproduce.py: the check could not run: {error}", file=sys.stderr)
        return 1
    if not made:
        return 0
    jobs = ", ".join(f"{job} (code {fp})" for job, fp in made["jobs"].items() if job not in made["refused"])
    print(f"certified in {time.time() - started:.0f} s: today's code ({made['fingerprint']}) gives the outputs of "
          f"the code its rows were measured on, bit for bit, for {jobs}, and every statement changed since then "
          f"ran in the check (results/certify/certificates.json): those rows stay current")
    for job, why in made["refused"].items():
        print(f"reproduce.py: not certified for the {job} rows: {why}; re-measure them "
              f"(python reproduce.py --only EXPERIMENT)", file=sys.stderr)
    return 1 if made["refused"] else 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    created = None
    try:
        check_flags(args)
        if args.certify:
            return certify()
        experiments = selected(args.only, args.smoke)
        for experiment in experiments if args.only and not args.plan else ():  # asked by name: it must run
            if cannot_run(experiment, args.glue_dir):
                raise UsageError(f"--only {experiment.name}: {cannot_run(experiment, args.glue_dir)}")
        runs_dir = os.path.abspath(args.runs_dir or os.path.join("runs", "reproduce-smoke" if args.smoke else "reproduce"))
        created = first_missing(runs_dir)  # removed again, with what is above it, if a refusal leaves it empty
        writable(runs_dir, make=not args.plan)  # --plan makes nothing
        root = runs_dir if args.smoke else ROOT  # --smoke judges its own results, under its runs
        results_dir = os.path.join(root, "results")
        cluster = args.address or os.environ.get("RAY_ADDRESS")
        engine = Engine(args.address) if cluster else None  # a cluster's slots are what its nodes hold
        try:
            slots = args.slots or (engine.slots(gpus=args.gpu_share) if engine else os.cpu_count() or 1)
            missing = show_plan(args, experiments, slots, runs_dir, results_dir)
            if args.plan:
                return 0
            for backend, names in missing.items():
                raise UsageError(f"{', '.join(names)} ran on {backend}, which is not installed: install it (README, "
                                 "Backends) or pass --backend jax to run every experiment on jax (its numbers will "
                                 "differ)")
            catalog = {e.name: e for e in selected(None, args.smoke)}
            with only_one(runs_dir):
                engine = engine or Engine()
                engine.check_shared(runs_dir)
                if args.glue_dir:
                    experiments = with_needs(experiments, catalog, runs_dir)
                with stop_on_sigterm():  # after Ray's start, which sets a SIGTERM handler of its own
                    done, held = reproduce(experiments, args.slots, runs_dir, results_dir, args.glue_dir, catalog,
                                           args.backend, premises=not args.smoke,
                                           deadline=args.hours and time.time() + 3600 * args.hours, engine=engine,
                                           gpus=args.gpu_share)
        finally:
            if engine is not None:
                engine.close()
    except UsageError as error:
        print(f"reproduce.py: error: {error}", file=sys.stderr)
        for folder, _, _ in sorted(os.walk(created or os.devnull), reverse=True):  # the empty folders alone
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, or kill: its runs have stopped too
        print("reproduce.py: stopped; run the same command again to go on (finished runs are kept, stopped ones go "
              "on from their last checkpoint)", file=sys.stderr)
        return 130
    if not args.smoke:
        tables.main([])  # README.md and the results pages, from the files just written
    print_verdicts(done, root, held, args.smoke)
    return 0


def show_plan(args, experiments, slots, runs_dir, results_dir):
    """Print the plan (each experiment's runs and time, what is left of it, the backends it lacks, the quick
    rows or the GPU costs); returns {backend not installed: [experiments that run on it]}."""
    plan = make_plan(experiments, slots, results_dir, args.glue_dir)
    print_plan(plan, slots, what_is_left(plan, runs_dir, results_dir))
    missing = missing_backends(experiments, args.backend)
    for backend, names in missing.items():
        print(f"  {', '.join(names)} run{'s' if len(names) == 1 else ''} on {backend}, which is not installed "
              "here: install it (README, Backends), or pass --backend jax (its numbers will differ)")
    if args.only is None and not args.smoke:
        if args.plan:
            print_quick_rows(results_dir, slots)
    elif not args.smoke:  # the experiments sized for GPUs that --only names, at their GPU cost too
        print_gpu_plan([e for e in experiments if e.hardware == "gpu"], results_dir)
    return missing


def check_flags(args):
    """Refuse, in one line, a flag beside --certify (which runs its own check), or a --slots, --gpu-share,
    --hours or --glue-dir that cannot be."""
    given = [flag for flag, value in (("--only", args.only), ("--plan", args.plan), ("--smoke", args.smoke),
                                      ("--hours", args.hours), ("--glue-dir", args.glue_dir),
                                      ("--backend", args.backend), ("--runs-dir", args.runs_dir),
                                      ("--slots", args.slots), ("--address", args.address)) if value]
    if args.certify and given:
        raise UsageError(f"--certify runs its own check; leave out {', '.join(given)}")
    if args.slots is not None and not 1 <= args.slots <= MAX_SLOTS:
        raise UsageError(f"--slots must be a positive number of runs at a time, at most {MAX_SLOTS:,}, got "
                         f"{args.slots}")
    if not 0 < args.gpu_share <= 1:
        raise UsageError(f"--gpu-share must lie in (0, 1], a share of one GPU, got {args.gpu_share}")
    if args.hours is not None and not 0 < args.hours < math.inf:
        raise UsageError(f"--hours must be a positive, finite number of hours, got {args.hours}")
    if args.glue_dir and not os.path.isdir(args.glue_dir):
        raise UsageError(f"--glue-dir {args.glue_dir}: no such folder; pass the folder holding MRPC's "
                         "train.tsv and dev.tsv (or MRPC/)")


def missing_backends(experiments, backend=None):
    """{Keras backend not installed here: the names of the `experiments` that run on it (or all, on `backend`)}."""
    return {name: [e.name for e in experiments if (backend or e.backend) == name]
            for name in sorted({backend or e.backend for e in experiments}) if importlib.util.find_spec(name) is None}


def print_quick_rows(results_dir, slots):
    """--plan's last lines: the quick rows to run first, and the experiments sized for GPUs."""
    quick = [e for e in EXPERIMENTS.values() if e.quick]
    fit = max(1, slots // max(e.threads for e in quick))
    minutes = wall_minutes(make_plan(quick, fit, results_dir), fit)
    print(f"quick rows first: --only {','.join(e.name for e in quick)}, about {hours(minutes)} "
          f"({'; '.join(e.title for e in quick)})")
    print_gpu_plan([e for e in EXPERIMENTS.values() if e.hardware == "gpu"], results_dir)


def print_verdicts(done, root, held, smoke):
    """The verdicts of the Results table's rows that judge the experiments `done`, from root/results/."""
    print("\nverdicts" + (" (smoke: tiny runs, no claim is judged by them)" if smoke else "")
          + (f" of results/ as it stands: {held} run{'s' if held > 1 else ''} of these experiments did not start "
             "(--hours)" if held else "") + ":")
    for claim, verdict in verdicts(done, root):
        print(f"  {claim}\n      {verdict}")


if __name__ == "__main__":
    sys.exit(main())
