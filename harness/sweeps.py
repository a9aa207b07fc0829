"""Sweeps: the papers' comparisons as lists of runs (`sweep_plan`), the machinery both scripts use to
run them (`strip_flags`, `run_in_processes`), and their plots.

    defaults, runs = sweep_plan("fig2", "cpu")    # train_nmt.py --sweep fig2: (flags, [(name, flags)])
    strip_flags(argv, {"--out": 1})               # the command line without the flags a run sets itself
    run_in_processes("train_nmt.py", todo, jobs)  # --jobs: runs at a time, each in its own process
    plot_runs(curves, "curves.png")               # validation loss and BLEU of translation runs
    plot_panels(path, "updates", bert_loss_panels(curves))   # masked-LM loss and accuracy of BERT runs
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import threading

from harness.errors import UsageError


def _runs(*runs):
    """Sweep runs as (name, flags) from (name, flag string) pairs."""
    return [(name, flags.split()) for name, flags in runs]


def sweep_plan(name, preset, depths=None):
    """(flags, runs) of a sweep at a preset: `flags` are the sweep's defaults, which the command line
    overrides; each run is (name, flags it sets itself), the flags that define the comparison.

    fig2   Figure 2 (Section 3.2): with Adam, Post-LN with warmup and without, at each rate of
           `fig2_lrs` under the preset's `fig2_schedule`, and Pre-LN without warmup; Post-LN with the
           short warmup of Figure 2 (500 updates of the paper's 4,000: `short_warmup`), which shows how
           sensitive the result is to T_warmup; and with plain SGD at each rate of `fig2_sgd_lrs`
           (the paper's 5e-3 and 1e-3), Post-LN with warmup and without (Figure 2(c, d)). Under a
           constant rate (the cpu preset) the no-warmup runs are also the control: Post-LN and Pre-LN
           under one and the same rate from update 1, so a gap between them is the placement's. Under
           inverse sqrt (the paper's "warmup = 1": lr_max / sqrt(t) from update 1) the rate itself is
           smaller without warmup, so the control is added as two more runs at a constant `control_lr`.
    fig4   Figure 4 (Section 4): Pre-LN without warmup (under the preset's `fig4_pre_schedule`) against
           Post-LN with warmup, at each rate of `fig4_lrs`, and, where `fig4_radam`, both with RAdam
           without warmup (linear decay).
    depth  DeepNet (Figure 1, Table 1): Post-LN, Pre-LN and DeepNorm at each depth of `depths`
           (encoder = decoder layers), one learning rate and schedule for all.
    """
    s = SWEEP_SETTINGS[preset]
    lr, warmup = s["lr"], f"--warmup-steps {s['warmup']}"
    if name == "fig2":
        schedule = s["fig2_schedule"]
        runs = [run for rate in s["fig2_lrs"] for run in (
            (f"post-warmup-lr{rate}", f"--norm post --lr {rate} --schedule {schedule}"),
            (f"post-nowarmup-lr{rate}", f"--norm post --lr {rate} --schedule {schedule} --no-warmup"),
            (f"pre-nowarmup-lr{rate}", f"--norm pre --lr {rate} --schedule {schedule} --no-warmup"),
            (f"post-warmup{s['short_warmup']}-lr{rate}",
             f"--norm post --lr {rate} --schedule {schedule} --warmup-steps {s['short_warmup']}"))]
        runs += [run for rate in s["fig2_sgd_lrs"] for run in (
            (f"post-sgd-warmup-lr{rate}", f"--norm post --optimizer sgd --lr {rate} --schedule {schedule}"),
            (f"post-sgd-nowarmup-lr{rate}", f"--norm post --optimizer sgd --lr {rate} --schedule {schedule} --no-warmup"))]
        if schedule == "inverse_sqrt":
            control = s["control_lr"]
            runs += [(f"{norm}-constant-lr{control}", f"--norm {norm} --lr {control} --schedule constant --no-warmup")
                     for norm in ("post", "pre")]
        return f"{warmup} {s['fig2_flags']}".split(), _runs(*runs)
    if name == "fig4":
        pre = s.get("fig4_pre_schedule", "step")
        runs = [run for rate in s.get("fig4_lrs", [lr]) for run in (
            (f"post-warmup-lr{rate}", f"--norm post --lr {rate} --schedule inverse_sqrt"),
            (f"pre-nowarmup-lr{rate}", f"--norm pre --lr {rate} --schedule {pre} --no-warmup"))]
        if s.get("fig4_radam", True):
            runs += [("post-radam-nowarmup", f"--norm post --lr {lr} --optimizer radam --schedule linear --no-warmup"),
                     ("pre-radam-nowarmup", f"--norm pre --lr {lr} --optimizer radam --schedule linear --no-warmup")]
        return f"{warmup} {s['fig4_flags']}".split(), _runs(*runs)
    return s["depth_flags"].split(), _runs(*[
        (f"{norm}-{depth}L", f"--norm {norm} --encoder-layers {depth} --decoder-layers {depth}")
        for depth in (depths or s["depths"]) for norm in ("post", "pre", "deepnorm")])


SWEEPS = ("fig2", "fig4", "depth")


SWEEP_SETTINGS = {
    # Chosen by measurement on the 2-core CPU (results/fig2/grid.csv, results/depth; the README).
    # short_warmup: Figure 2's 500 of 4,000 warmup updates, scaled to the preset's warmup (300 / 8 = 38).
    # fig2: 5 epochs, since Post-LN with warmup at 6 + 6 layers reached 10.4 test BLEU in 3 and 25.1 in 5
    # (results/fig2/grid.csv): a baseline that trains.
    "cpu": dict(lr="1e-3", warmup=300, fig2_lrs=["1e-3"], fig2_schedule="constant", depths=[6, 12, 24],
                short_warmup=38, fig2_sgd_lrs=["5e-3", "1e-3"],
                fig2_flags="--encoder-layers 6 --decoder-layers 6 --epochs 5", fig4_flags="",
                depth_flags="--d-model 64 --ffn-dim 128 --schedule constant --lr 1e-3 --warmup-steps 200 --epochs 1 "
                            "--eval-every 120 --valid-sentences 200 --beam 1"),
    # The paper (Section 3.2): Adam at lr_max 5e-4 and 1e-3 with warmup 4000, 500 and 1 (none), SGD at 5e-3
    # and 1e-3 with warmup 4000 and none, inverse sqrt after the warmup in every run; DeepNet's depths.
    "iwslt": dict(lr="5e-4", warmup=4000, fig2_lrs=["5e-4", "1e-3"], fig2_schedule="inverse_sqrt", control_lr="5e-4",
                  short_warmup=500, fig2_sgd_lrs=["5e-3", "1e-3"],
                  depths=[6, 12, 24, 48], fig2_flags="", fig4_flags="", depth_flags="--schedule inverse_sqrt --lr 5e-4"),
    # WMT14 (Section 4, Figure 4(c, d)): Pre-LN without warmup at lr 7e-4 and 1.5e-3, held until epoch 6
    # then inverse sqrt, against Post-LN with warmup 4000 at the same lr_max; RAdam was tried on IWSLT14
    # only. fig2 is Figure 2's design (Section 3.2, IWSLT14 in the paper) at the WMT14 rates.
    "wmt14": dict(lr="7e-4", warmup=4000, fig2_lrs=["7e-4", "1.5e-3"], fig2_schedule="inverse_sqrt",
                  control_lr="7e-4", short_warmup=500, fig2_sgd_lrs=["5e-3", "1e-3"],
                  fig4_lrs=["7e-4", "1.5e-3"], fig4_pre_schedule="decay_then_inverse_sqrt",
                  fig4_radam=False, depths=[6, 12, 24, 48], fig2_flags="", fig4_flags="",
                  depth_flags="--schedule inverse_sqrt --lr 7e-4"),
    # For tests.
    "tiny": dict(lr="5e-4", warmup=2, fig2_lrs=["5e-4"], fig2_schedule="inverse_sqrt", control_lr="5e-4", depths=[1, 2],
                 short_warmup=1, fig2_sgd_lrs=["5e-3"],
                 fig2_flags="", fig4_flags="", depth_flags="--schedule constant --warmup-steps 2"),
}


# --- running -------------------------------------------------------------------------------------

def strip_flags(argv, flags):
    """argv without the given flags (flag -> number of values it takes)."""
    kept, skip = [], 0
    for token in argv:
        if skip:
            skip -= 1
            continue
        name = token.split("=", 1)[0]
        if name in flags:
            skip = 0 if "=" in token else flags[name]
            continue
        kept.append(token)
    return kept


def thread_env(jobs):
    """Environment variables that give each of `jobs` processes side by side cores / jobs kernel threads:
    OpenMP's (torch), TensorFlow's and XLA's Eigen pool (jax; one thread turns the pool off). XLA_FLAGS
    keeps what it held before; only `--flag=value` words, since XLA stops reading at any other word."""
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    xla = f"--xla_cpu_multi_thread_eigen={'true' if threads != '1' else 'false'}"
    return dict(OMP_NUM_THREADS=threads, TF_NUM_INTRAOP_THREADS=threads, TF_NUM_INTEROP_THREADS="1",
                XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS"), xla])))


def run_in_processes(script, todo, jobs):
    """Run `jobs` runs at a time, each `SCRIPT RUN_ARGV` (`script`: the script's path) in its own process with
    cores / jobs threads (its output appended to RUN/train.log); returns {name: results.json} in the order the
    runs ended. Two single-threaded runs on two cores do more work than two two-threaded runs one after the
    other: the small matrices of the CPU presets keep a second thread only partly busy.

    `todo` holds (name, run directory, RUN_ARGV). A pool of `jobs` threads runs them, each thread one run's
    process at a time, so the next run starts as soon as one ends; runs start in the order of `todo`. A run
    fails when its process exits with an error or leaves no results.json: the other runs go on, and the
    failed ones are named together in one UsageError at the end. An error in this process (an interrupt, a
    run directory that cannot be made) starts no further run and is raised once the running ones have ended.
    """
    env = dict(os.environ, **thread_env(jobs))
    threads = env["OMP_NUM_THREADS"]
    results, failed, started = {}, [], [0]
    turn, finished = threading.Condition(), threading.Lock()

    def run(index, name, run_dir, run_argv):
        """The run `todo[index]` in its own process, started after the runs before it; its outcome recorded."""
        with turn:
            turn.wait_for(lambda: started[0] == index)
            started[0] += 1
            turn.notify_all()
            os.makedirs(run_dir, exist_ok=True)
            print(f"== {name}: started ({threads} thread{'s' if threads != '1' else ''}; log {run_dir}/train.log)",
                  flush=True)
        with open(os.path.join(run_dir, "train.log"), "ab") as log:
            code = subprocess.run([sys.executable, script, *run_argv], env=env, stdout=log,
                                  stderr=subprocess.STDOUT).returncode
        done = os.path.join(run_dir, "results.json")
        with finished:  # one outcome at a time: results and messages in the order the runs ended
            if code != 0 or not os.path.exists(done):
                failed.append(f"{name} (exit code {code}; see {run_dir}/train.log)")
                return
            results[name] = json.load(open(done))
            print(f"== {name}: {results[name]['outcome']}, test BLEU {results[name].get('test_bleu', '-')}",
                  flush=True)

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="sweep-run") as pool:
        runs = [pool.submit(run, index, *entry) for index, entry in enumerate(todo)]
        try:
            for ended in concurrent.futures.as_completed(runs):
                ended.result()  # an error in a thread of the pool is raised here
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # no further run starts; the running ones are awaited
            raise
    if failed:
        raise UsageError(f"sweep runs failed: {', '.join(failed)}; fix the cause and rerun the sweep with --resume")
    return results
