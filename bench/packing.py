"""Several runs of an experiment packed on one GPU, against one run at a time: the wall time of each way.

    python bench/packing.py --only fig4 --runs 4 --at-a-time 4          # fig4's first 4 runs, 4 then 1 at a time
    python bench/packing.py --only fig4 --runs 4 --at-a-time 4 --smoke  # the same runs at the tiny size

`reproduce.py --gpu-share 0.25` packs runs on a GPU through Ray. This measures the same thing where Ray is not
installed: each run is the process a reproduction would start (`sweeps.sweep_tasks`: the run's worker command,
its experiment's backend and threads), in the environment its Ray task would give it (`runner.run_env`: on a
GPU, jax takes only its share `--gpu-share` of the memory, by default one over `--at-a-time`), started and
taken in by the runner's own loop (`runner.drive`). The runs go first `--at-a-time` at a time, then one at a
time, each round in a folder of its own under --out (default runs/packing), each run's output in its
train.log. One JSON line a round, printed and appended to OUT/packing.jsonl: runs, at a time, wall seconds,
each run's seconds and exit code. Run it on a quiet host; with `nvidia-smi -l 1` beside it, the GPU's
utilisation while each round ran.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness.console import OneLineParser, UsageError  # noqa: E402
from reproduction.experiments import EXPERIMENTS  # noqa: E402
from harness.files import prepare_out_dir  # noqa: E402
from harness.rundir import RunDir  # noqa: E402
from reproduction.runner import announce, drive, run_env  # noqa: E402
from reproduction.sweeps import sweep_tasks  # noqa: E402

PROG = "bench/packing.py"
TRANSLATION = [name for name, experiment in EXPERIMENTS.items() if experiment.job == "translation"]


def build_parser():
    p = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="fig4", choices=TRANSLATION, help="the translation experiment whose first "
                   "runs go (default fig4)")
    p.add_argument("--runs", type=int, default=4, metavar="N", help="its first N runs (default 4)")
    p.add_argument("--at-a-time", type=int, default=4, metavar="K", help="runs side by side in the packed "
                   "round (default 4)")
    p.add_argument("--gpu-share", type=float, metavar="SHARE", help="each run's share of one GPU's memory in the "
                   "packed round (default 1/K; 0: no GPU)")
    p.add_argument("--smoke", action="store_true", help="the runs at the tiny size (`reproduce.py --smoke`'s)")
    p.add_argument("--out", default=os.path.join("runs", "packing"), help="the rounds' folders and packing.jsonl "
                   "(default runs/packing): a new or empty folder")
    return p


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    problems = [f"--runs must be a positive number, got {args.runs}" if args.runs < 1 else "",
                f"--at-a-time must be a positive number, got {args.at_a_time}" if args.at_a_time < 1 else "",
                f"--gpu-share must lie in [0, 1], got {args.gpu_share}"
                if args.gpu_share is not None and not 0 <= args.gpu_share <= 1 else "",
                f"--out {args.out}: a file, not a folder; choose a new folder" if os.path.isfile(args.out) else
                f"--out {args.out}: not an empty folder; choose a new one"
                if os.path.isdir(args.out) and os.listdir(args.out) else ""]
    try:
        if not any(problems):
            prepare_out_dir(args.out)
    except UsageError as error:
        problems.append(str(error))
    if any(problems):
        build_parser().exit(2, f"{PROG}: error: {next(p for p in problems if p)}\n")
    return args


class Processes:
    """A stand-in for Ray's engine (`runner.Engine`) under the runner's own loop (`runner.drive`): each task
    is its process on this host, in the environment `runner.run_env` gives it, with a share of the GPU where
    `share` is not 0."""

    def __init__(self, share):
        self.share = share

    def announce(self, task):
        announce(task, live=False)

    def submit(self, task):
        with RunDir(task.run_dir).log() as log:
            process = subprocess.Popen([sys.executable, *task.command], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                       env=run_env(task, ("0",) if self.share else ()))
        return process, time.perf_counter()

    def wait(self, handles):
        """The handles that have ended, each with its outcome ({code, seconds}), once one has."""
        while not any(process.poll() is not None for process, _ in handles):
            time.sleep(0.2)
        return [((process, start), dict(code=process.returncode, seconds=time.perf_counter() - start))
                for process, start in handles if process.poll() is not None]


def run_round(tasks, at_a_time, share):
    """Run `tasks` (`runner.Task`s) `at_a_time` at a time (`Processes`); returns (wall seconds, [(seconds, exit
    code)] in the tasks' order)."""
    ended, started = {}, time.perf_counter()

    def take(task, outcome):
        ended[task.name] = (round(outcome["seconds"], 1), outcome["code"])

    drive(Processes(share), lambda running, failed: [task for task in tasks if task.name not in ended
                                                     and task not in running.values()], lambda task: at_a_time, take)
    return round(time.perf_counter() - started, 1), [ended[task.name] for task in tasks]


def main(argv=None):
    args = parse_args(argv)
    experiment = EXPERIMENTS[args.only].smoke() if args.smoke else EXPERIMENTS[args.only]
    runs = experiment.runs[:args.runs]
    share = 1 / args.at_a_time if args.gpu_share is None else args.gpu_share
    rounds = []
    for at_a_time, each in ((min(args.at_a_time, len(runs)), share), (1, 1.0 if share else 0.0)):
        out = os.path.abspath(os.path.join(args.out, f"{at_a_time}-at-a-time"))
        tasks = sweep_tasks(experiment.job, runs, out, resume=False, env=(("KERAS_BACKEND", experiment.backend),),
                            done=lambda run_dir: False, threads=experiment.threads, gpus=each)
        wall, ended = run_round(tasks, at_a_time, each)
        line = dict(experiment=args.only, smoke=args.smoke, runs=len(runs), at_a_time=at_a_time, gpu_share=each,
                    wall_s=wall, run_s=[seconds for seconds, _ in ended], exit_codes=[code for _, code in ended])
        print(json.dumps(line), flush=True)
        with open(os.path.join(args.out, "packing.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        rounds.append(line)
    packed, alone = rounds
    print(f"{len(runs)} runs of {args.only}: {packed['wall_s']:.0f} s {packed['at_a_time']} at a time, "
          f"{alone['wall_s']:.0f} s one at a time ({alone['wall_s'] / packed['wall_s']:.2f}x)", flush=True)
    return 0 if all(code == 0 for line in rounds for code in line["exit_codes"]) else 1


if __name__ == "__main__":
    sys.exit(main())
