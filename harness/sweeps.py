"""Running lists of runs: each run in its own process, `jobs` at a time (`run_tasks`), and the sweeps'
tables and plots written from their run directories (`summarize`). Without Keras.

    run_sweep("translation", "fig2", runs, "runs/sweep-fig2-cpu", jobs=2)  # train_nmt.py --sweep fig2
    run_tasks([Task("a", "runs/a", command), ...], jobs=2)                   # the pool, with dependencies
    summarize("translation", "depth", runs, "runs/sweep-depth-cpu", "results/depth")   # table and plots

A run's process is `python -m harness.worker JOB RUN_DIR FLAGS` (`worker_command`): the run's spec goes
to it as the JSON of its given values (`spec.flags()`), and the worker builds the same spec again. The
runs of experiments (harness/experiments.py) and of reproduce.py go through the same pool.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from harness.errors import UsageError
from harness.experiments import final_loss
from harness.files import is_finite, prepare_out_dir, write_csv, write_json
from harness.plots import bert_loss_panels, plot_depth, plot_panels, plot_runs
from harness.provenance import code_version
from harness.rundir import RunDir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def thread_env(jobs, threads=None):
    """Environment variables that give each of `jobs` processes side by side cores / jobs kernel threads
    (or `threads` each): OpenMP's (torch), TensorFlow's and XLA's Eigen pool (jax; one thread turns the
    pool off). XLA_FLAGS keeps what it held before; only `--flag=value` words, since XLA stops reading at
    any other word. A run's numbers depend on its thread count (the order of its sums), so reproduce.py
    gives each run the threads its results were measured with."""
    threads = str(threads or max(1, (os.cpu_count() or 1) // jobs))
    xla = f"--xla_cpu_multi_thread_eigen={'true' if threads != '1' else 'false'}"
    return dict(OMP_NUM_THREADS=threads, TF_NUM_INTRAOP_THREADS=threads, TF_NUM_INTEROP_THREADS="1",
                XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS"), xla])))


# --- the pool ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Task:
    """One run to start as a process: `command` (argv) writes `run_dir`/results.json; it starts once
    the tasks named in `after` have ended well, with the environment variables `env` ((name, value)
    pairs, e.g. the run's KERAS_BACKEND) on top of this process's."""

    name: str
    run_dir: str
    command: tuple
    after: frozenset = field(default_factory=frozenset)
    env: tuple = ()


def worker_command(job, run_dir, spec):
    """The argv of one run's process: harness/worker.py builds `spec` again from its given values."""
    return (sys.executable, "-m", "harness.worker", job, run_dir, json.dumps(spec.flags()))


def run_tasks(tasks, jobs, live=False, started=None, ended=None):
    """Run `tasks` (`Task`s), `jobs` at a time, each in its own process with cores / jobs threads, in the
    order given as far as their `after` allow; returns {name: results.json} in the order the runs ended.
    Two single-threaded runs on two cores do more work than two two-threaded runs one after the other:
    the small matrices of the CPU presets keep a second thread only partly busy.

    Each run's output goes to RUN/train.log, or with `live` (one run at a time) to this terminal. A run
    fails when its process exits with an error or leaves no results.json: the others go on (but those
    after it), and the failed ones are named together in one UsageError at the end. `started(name)` is
    called as each run starts, `ended(name, result)` as each run ends well, both in this thread. An error
    in this process (an interrupt) starts no further run and is raised once the running ones have ended.
    """
    env = dict(os.environ, **thread_env(jobs))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    threads = env["OMP_NUM_THREADS"]
    results, failed, waiting, running = {}, {}, list(tasks), {}  # failed: {name: why}
    names = {task.name for task in tasks}

    def announce(task):  # in this thread, so that the lines come in the order the runs start
        os.makedirs(task.run_dir, exist_ok=True)
        if started:
            started(task.name)
        count = dict(task.env).get("OMP_NUM_THREADS", threads)
        print(f"== {task.name}: started ({count} thread{'s' if count != '1' else ''}"
              + ("" if live else f"; log {task.run_dir}/train.log") + ")", flush=True)

    def start(task):
        own = dict(env, **dict(task.env))
        if "OMP_NUM_THREADS" in dict(task.env):  # the task's own threads, on top of what XLA_FLAGS held before
            own.update(thread_env(jobs, dict(task.env)["OMP_NUM_THREADS"]))
        if live:
            return subprocess.run(task.command, env=own).returncode
        with open(os.path.join(task.run_dir, "train.log"), "ab") as log:
            return subprocess.run(task.command, env=own, stdout=log, stderr=subprocess.STDOUT).returncode

    def ready(task):
        return all(name in results or name not in names for name in task.after)

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="run") as pool:
        try:
            while waiting or running:
                blocked = [t for t in waiting if t.after & set(failed)]
                for task in blocked:
                    waiting.remove(task)
                    failed[task.name] = f"not started: {', '.join(sorted(task.after))} failed"
                while len(running) < jobs and any(ready(t) for t in waiting):
                    task = next(t for t in waiting if ready(t))
                    waiting.remove(task)
                    announce(task)
                    running[pool.submit(start, task)] = task
                if not running:
                    break
                done, _ = concurrent.futures.wait(running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    task, code = running.pop(future), future.result()
                    result = RunDir(task.run_dir).results()
                    if code != 0 or result is None:
                        failed[task.name] = f"exit code {code}" + ("" if live else f"; see {task.run_dir}/train.log")
                        continue
                    results[task.name] = result
                    translation = "outcome" in result and "final_valid_accuracy" not in result
                    print(f"== {task.name}: {result.get('outcome', 'done')}"
                          + (f", test BLEU {result.get('test_bleu', '-')}" if translation else ""), flush=True)
                    if ended:
                        ended(task.name, result)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)  # no further run starts; the running ones are awaited
            raise
    if failed:
        named = ", ".join(f"{name} ({why})" for name, why in failed.items())
        raise UsageError(f"runs failed: {named}; fix the cause and run the same command again (finished runs are kept)")
    return results


def run_in_processes(script, todo, jobs):
    """`run_tasks` for runs of a script: `todo` holds (name, run directory, argv of `script`)."""
    return run_tasks([Task(name, run_dir, (sys.executable, script, *argv)) for name, run_dir, argv in todo], jobs)


# --- sweeps -----------------------------------------------------------------------------------------

def is_done(run_dir, current_code=False):
    """Whether the run in `run_dir` has ended (a results.json that is not "stopped"); with `current_code`,
    ended on today's code (its `code_version`)."""
    result = RunDir(run_dir).results()
    if result is None or result.get("outcome") == "stopped":
        return False
    return not current_code or (result.get("code_version") or {}).get("fingerprint") == code_version()["fingerprint"]


def sweep_tasks(job, runs, out, resume, prefix="", env=(), current_code=False, inputs=None):
    """The `Task`s of an experiment's runs (`experiments.Run`) in run directories under `out`: those not
    done yet (`is_done`; on today's code only, with `current_code`), each resumed where `resume` allows
    and its run directory holds a run. BERT's later runs take the first run's WordPiece vocabulary (the
    trainer may pick other pieces where merge counts tie), so they start after it. Task names are
    `prefix` + the run's name; `env`: (NAME, value) pairs each task's process gets; `inputs(spec)` -> (spec, names of the tasks it
    waits for): what a run takes from other experiments' runs (reproduce.py's fine-tuning)."""
    tasks = []
    for index, run in enumerate(runs):
        run_dir = os.path.join(out, run.name)
        if is_done(run_dir, current_code=current_code):
            if not current_code:
                print(f"== {run.name}: done already ({run_dir})")
            continue
        resumed = bool(resume and RunDir(run_dir).holds_run())
        spec, after = run.spec.but(out=run_dir, **({"resume": resumed} if hasattr(run.spec, "resume") else {})), set()
        if job == "bert" and index > 0:  # the first run's vocabulary; harness/worker.py reads its path
            spec, after = spec.but(vocab=f"@{os.path.join(out, runs[0].name)}"), {prefix + runs[0].name}
        if inputs:
            spec, more = inputs(spec)
            after |= set(more)
        tasks.append(Task(prefix + run.name, run_dir, worker_command(job, run_dir, spec), frozenset(after), tuple(env)))
    return tasks


def run_sweep(job, name, runs, out, jobs=1, resume=False):
    """A script's --sweep: the runs not done yet in run directories under `out` (`sweep_tasks`), `jobs`
    at a time (one: each run's output on this terminal), then the sweep's table and plots (`summarize`)."""
    out = prepare_out_dir(out)
    run_tasks(sweep_tasks(job, runs, out, resume), jobs, live=jobs == 1)
    return summarize(job, name, runs, out, out)


def summarize(job, name, runs, out, folder, pair=None, plot=True):
    """An experiment's table and plots in `folder` from its run directories under `out`: for translation,
    results-NAME.csv (a row per run), curves-NAME.png and, for depth, depth.png; for BERT, results.csv,
    curves.csv, speedup.json (Figure 5(a)'s measure between the runs `pair` names, (Post-LN, Pre-LN);
    default: each placement's run with the lowest final validation loss) and curves.png. Prints the table.
    `plot=False`: no figures (a protocol's own figures replace them: `reproduction.draw_protocol`)."""
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
    if plot:
        plot_runs(curves, os.path.join(folder, f"curves-{name}.png"))
    if plot and name == "depth":
        plot_depth(table, curves, os.path.join(folder, "depth.png"))
    print(f"\n{'run':<24} {'outcome':<9} {'valid loss':>10} {'test BLEU':>9} {'tok. BLEU':>9} {'minutes':>7}")
    for row in table:
        show = lambda v, f=".2f": format(v, f) if v is not None else "-"  # noqa: E731
        print(f"{row['run']:<24} {row['outcome']:<9} {show(row['final_valid_loss'], '.3f'):>10} "
              f"{show(row['test_bleu']):>9} {show(row['test_tokenized_bleu']):>9} {show(row['minutes'], '.1f'):>7}")
    if plot:
        print(f"plots: {os.path.join(folder, f'curves-{name}.png')}"
              + (f", {os.path.join(folder, 'depth.png')}" if name == "depth" else ""))
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

