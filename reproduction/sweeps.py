"""The sweeps' runs as tasks (`sweep_tasks`, run on Ray by reproduction/runner.py), and their tables and plots
written from their run directories (`summarize`). Without Keras.

    run_sweep("translation", "fig2", runs, "runs/sweep-fig2-cpu", jobs=2)  # train_nmt.py --sweep fig2
    summarize("translation", "depth", runs, "runs/sweep-depth-cpu", "results/depth")   # table and plots

A run's process is `python -m reproduction.worker JOB RUN_DIR FLAGS` (`worker_command`), for a script's sweep
and for reproduce.py alike.
"""

import json
import os

from reproduction.experiments import final_loss
from harness.files import is_finite, prepare_out_dir, write_csv, write_json
from harness.plots import bert_loss_panels, plot_depth, plot_panels, plot_runs
from harness.rundir import RunDir, code_version
from reproduction.runner import Task, run_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_command(job, run_dir, flags):
    """The argv after the interpreter of one run's process: reproduction/worker.py builds the run's spec again from
    `flags`, its given values (`spec.flags()`)."""
    return ("-m", "reproduction.worker", job, run_dir, json.dumps(flags))


# --- sweeps -----------------------------------------------------------------------------------------

def is_done(run_dir):
    """Whether the run in `run_dir` has ended (a results.json that is not "stopped")."""
    result = RunDir(run_dir).results()
    return result is not None and result.get("outcome") != "stopped"


def sweep_tasks(job, runs, out, resume, prefix="", env=(), done=None, settings=None, threads=1, gpus=0.0):
    """The `Task`s of the `runs` (`experiments.Run`) not done yet in run folders under `out` (`done(run_dir)`;
    by default `is_done`, with a line for each run done), named `prefix` + RUN, each going on from its last
    checkpoint where `resume` allows; BERT's later runs wait for the first's WordPiece vocabulary. `env`:
    (NAME, value) pairs for each process; `settings`: values set on every run's spec (MRPC's data and
    checkpoints); `threads` and `gpus`: its resources (`Task`)."""
    tasks = []
    for index, run in enumerate(runs):
        run_dir = os.path.join(out, run.name)
        if (done or is_done)(run_dir):
            if not done:
                print(f"== {run.name}: done already ({run_dir})")
            continue
        spec, after = run.spec.but(out=run_dir, **(settings or {})), set()
        if job == "bert" and index > 0:  # the first run's vocabulary; reproduction/worker.py reads its path
            spec, after = spec.but(vocab=f"@{os.path.join(out, runs[0].name)}"), {prefix + runs[0].name}
        goes_on = resume and hasattr(spec, "resume")
        tasks.append(Task(prefix + run.name, run_dir, worker_command(job, run_dir, spec.but(**(
            {"resume": False} if goes_on else {})).flags()), frozenset(after), tuple(env),
            worker_command(job, run_dir, spec.but(resume=True).flags()) if goes_on else (), threads, gpus))
    return tasks


def run_sweep(job, name, runs, out, jobs=1, resume=False):
    """A script's --sweep: the runs not done yet in run directories under `out` (`sweep_tasks`), `jobs`
    at a time (one: each run's output on this terminal), then the sweep's table and plots (`summarize`)."""
    out = os.path.abspath(prepare_out_dir(out))
    threads = max(1, (os.cpu_count() or 1) // jobs)
    run_tasks(sweep_tasks(job, runs, out, resume, threads=threads), jobs, live=jobs == 1)
    return summarize(job, name, runs, out, out)


def summarize(job, name, runs, out, folder, pair=None, plot=True):
    """An experiment's table and plots in `folder` from its run folders under `out`: for translation,
    results-NAME.csv, curves-NAME.png and, for runs at several depths, depth.png; for BERT, results.csv,
    curves.csv, speedup.json (Figure 5(a)'s measure between the runs `pair` names, (Post-LN, Pre-LN); default:
    each placement's run of lowest final validation loss) and curves.png. Prints the table. `plot=False`:
    no figures (a protocol draws its own)."""
    dirs = {run.name: RunDir(os.path.join(out, run.name)) for run in runs}
    results = {run: d.results() for run, d in dirs.items()}
    curves = {run: d.rows() for run, d in dirs.items()}
    os.makedirs(folder, exist_ok=True)
    if job == "bert":
        return _summarize_bert(results, curves, folder, pair or _lowest_loss_pair(results), plot)
    table = [dict(run=run, norm=r["norm"], layers=r["layers"][0], outcome=r["outcome"], updates=r["updates"],
                  best_valid_loss=r["best_valid_loss"], final_valid_loss=r["final_valid_loss"],
                  best_valid_bleu=r["best_valid_bleu"], test_bleu=r.get("test_bleu"),
                  test_tokenized_bleu=r.get("test_tokenized_bleu"), minutes=r.get("train_minutes"),
                  code_version=(r.get("code_version") or {}).get("fingerprint"),
                  measured=(r.get("code_version") or {}).get("measured"))
             for run, r in results.items()]
    write_csv(os.path.join(folder, f"results-{name}.csv"), table)
    depths = len({row["layers"] for row in table}) > 1  # runs at several depths: BLEU against depth too
    if plot:
        plot_runs(curves, os.path.join(folder, f"curves-{name}.png"))
    if plot and depths:
        plot_depth(table, curves, os.path.join(folder, "depth.png"))
    print(f"\n{'run':<24} {'outcome':<9} {'valid loss':>10} {'test BLEU':>9} {'tok. BLEU':>9} {'minutes':>7}")
    for row in table:
        show = lambda v, f=".2f": format(v, f) if v is not None else "-"  # noqa: E731
        print(f"{row['run']:<24} {row['outcome']:<9} {show(row['final_valid_loss'], '.3f'):>10} "
              f"{show(row['test_bleu']):>9} {show(row['test_tokenized_bleu']):>9} {show(row['minutes'], '.1f'):>7}")
    if plot:
        print(f"plots: {os.path.join(folder, f'curves-{name}.png')}"
              + (f", {os.path.join(folder, 'depth.png')}" if depths else ""))
    return table


# --- Figure 5(a) ------------------------------------------------------------------------------------

def first_reaching(rows, target):
    """The first update whose validation loss is at most `target`, or None."""
    return next((int(r["updates"]) for r in rows if is_finite(r["valid_loss"]) and float(r["valid_loss"]) <= target),
                None)


def speedup(post_rows, pre_rows, unigram_entropy=None):
    """Figure 5(a)'s measure: the update at which Pre-LN first reaches Post-LN's final validation loss.

    ratio = (update at which Post-LN reaches it) / (update at which Pre-LN does), speed-up = ratio - 1;
    the paper: 700k / 500k = 1.4, a 40 % speed-up. `unigram_entropy` is recorded beside the target loss:
    a target above it is reached by a model that has learned little more than word frequencies.
    """
    finite = [r for r in post_rows if is_finite(r["valid_loss"])]
    if not finite:
        return dict(target_loss=None, post_update=None, pre_update=None, ratio=None, speedup=None,
                    unigram_entropy=unigram_entropy)
    target = float(finite[-1]["valid_loss"])
    post, pre = first_reaching(post_rows, target), first_reaching(pre_rows, target)
    return dict(target_loss=target, post_update=post, pre_update=pre, ratio=post / pre if pre else None,
                speedup=post / pre - 1 if pre else None, unigram_entropy=unigram_entropy)


def _lowest_loss_pair(results):
    """(Post-LN run, Pre-LN run): each placement's run with the lowest final validation loss (ties: the
    smaller rate), as Figure 5(a)'s protocol chooses each recipe's rate from its grid."""
    best = {}
    for name, result in results.items():
        key = (final_loss(result), result.get("lr") or 0.0, name)
        best[result["norm"]] = min(best.get(result["norm"], key), key)
    return best["post"][2], best["pre"][2]


def _summarize_bert(results, curves, folder, pair, plot):
    post, pre = pair
    gain = dict(speedup(curves[post], curves[pre], results[post].get("unigram_entropy")), post_run=post, pre_run=pre)
    table = [dict(run=name, outcome=r["outcome"], updates=r["updates"], final_valid_loss=r["final_valid_loss"],
                  final_valid_accuracy=r["final_valid_accuracy"], minutes=round(r["elapsed_s"] / 60, 1),
                  code_version=(r.get("code_version") or {}).get("fingerprint"),
                  measured=(r.get("code_version") or {}).get("measured"))
             for name, r in results.items()]
    write_csv(os.path.join(folder, "results.csv"), table)
    write_csv(os.path.join(folder, "curves.csv"), [dict(run=name, **{k: r[k] for k in ("updates", "lr", "valid_loss",
                                                                                    "valid_accuracy")})
                                                   for name, rows in curves.items() for r in rows])
    write_json(os.path.join(folder, "speedup.json"), dict(gain, code_version=code_version()))
    if plot:
        plot_panels(os.path.join(folder, "curves.png"), "updates", bert_loss_panels(curves))
    print(f"\n{'run':<16} {'outcome':<9} {'updates':>7} {'valid loss':>10} {'accuracy':>8} {'minutes':>7}")
    for row in table:
        loss = f"{row['final_valid_loss']:.3f}" if row["final_valid_loss"] is not None else "-"
        accuracy = f"{row['final_valid_accuracy']:.3f}" if row["final_valid_accuracy"] is not None else "-"
        print(f"{row['run']:<16} {row['outcome']:<9} {row['updates']:>7} {loss:>10} {accuracy:>8} {row['minutes']:>7}")
    if gain["pre_update"]:
        print(f"speed-up ({pre} against {post}): Pre-LN reaches Post-LN's final validation loss "
              f"{gain['target_loss']:.3f} at update "
              f"{gain['pre_update']}, Post-LN at {gain['post_update']}: {100 * gain['speedup']:.0f} % faster")
    else:
        print(f"speed-up ({pre} against {post}): Pre-LN never reached Post-LN's final validation loss")
    if plot:
        print(f"overlay plot: {os.path.join(folder, 'curves.png')}")
    return table, gain

