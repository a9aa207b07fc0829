"""reproduce.py's machinery (docs/reproduce.md): the plan, the runs on Ray, their files published into
results/, and the verdicts. Without Keras: every run is a process of its own.

    plan = make_plan(experiments, jobs, results_dir)      # [(experiment, runs, minutes, where they come from)]
    print_plan(plan, jobs)
    reproduce(experiments, jobs, runs_dir, results_dir, engine=Engine())  # runs, publishes, records times
    verdicts(experiments, root)                            # the Results table's rows, judged from results/
"""

import collections
import contextlib
import datetime
import json
import math
import os
import shutil
import time

try:
    import fcntl  # POSIX file locks (`only_one`)
except ImportError:  # Windows: no lock is taken
    fcntl = None

from harness.console import UsageError
from harness.files import CONFIG, read_csv, write_csv, write_json
from harness.plots import CURVES, curve_panels, plot_panels, plot_protocol
from harness.rundir import METRICS, PLACEMENT, RESULTS, RunDir, code_version, fingerprint
from reproduction import tables
from reproduction.certificates import certified_as, processor
from reproduction.experiments import EXPERIMENTS
from reproduction.experiments import published as published_results
from reproduction.runner import drive, ended, refuse_failed, why_failed
from reproduction.sweeps import summarize, sweep_tasks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = "timing.json"


# --- the plan -----------------------------------------------------------------------------------------

def cpu_name():
    """The processor recorded with each run's time, its model name and the digest of its instruction-set flags
    that names hosts in results/certify/ ("AMD EPYC (fb86c9)"): another kind of CPU sums in another order."""
    return "{} ({})".format(*processor())


def _minutes(entry):
    """A timing.json entry's wall time in minutes."""
    return entry["wall_s"] / 60


def read_timing(experiment, results_dir):
    """{run: entry} of the experiment's FOLDER/timing.json: each run's wall time as it was recorded."""
    return _read_json(os.path.join(results_dir, experiment.folder, TIMING)) or {}


def stretched(experiment, results_dir):
    """({run: minutes} of the runs of another experiment that the experiment's runs are at `longer_than`
    (folder, factor) times the updates, each stretched, where that comes from). The factor alone is no bound:
    a converged run also validates every 128 updates and may run on a slower host. Once some of the
    experiment's own runs have recorded their times, each stretch is scaled by what those took over their
    own stretches."""
    other, factor = experiment.longer_than
    source = read_timing(next(e for e in EXPERIMENTS.values() if e.folder == other), results_dir)
    own = read_timing(experiment, results_dir)
    both = [name for name in own if name in source]
    scale = sum(_minutes(own[n]) for n in both) / sum(_minutes(source[n]) * factor for n in both) if both else 1.0
    return ({name: _minutes(entry) * factor * scale for name, entry in source.items()},
            f"{other}/{TIMING}: the same runs at {factor:g}x the updates"
            + (f", times {scale:.2f} as its {len(both)} recorded runs took" if both else ""))


def recorded_minutes(experiment, results_dir):
    """(minutes of the experiment's runs as FOLDER/timing.json records them, where that comes from); an
    experiment whose runs are another's at more updates (`longer_than`) takes those runs' times, stretched
    (`stretched`), for the runs that have not recorded their own; without them, its first guess."""
    names = [run.name for run in experiment.runs]
    minutes = {name: _minutes(entry) for name, entry in read_timing(experiment, results_dir).items()}
    source = f"{experiment.folder}/{TIMING}"
    if experiment.longer_than and not all(name in minutes for name in names):
        more, source = stretched(experiment, results_dir)
        minutes = {**more, **minutes}
    if names and all(name in minutes for name in names):
        return sum(minutes[name] for name in names), source
    return experiment.minutes, "a first guess: no run of it has recorded its time"


def protocol_minutes(experiment, results_dir):
    """(runs, minutes, where they come from) of a protocol in stages: once published, the runs it held then
    (runs-NAME.csv) at their recorded times, and any it holds now beyond those at their mean; before, the runs
    it holds when its premises hold and no grid widens, those not recorded at the minutes per layer of those
    recorded; else its first guess."""
    folder = os.path.join(results_dir, experiment.folder)
    timing = read_timing(experiment, results_dir)
    published = [row["run"] for row in read_csv(os.path.join(folder, f"runs-{experiment.name}.csv"))]
    times = [_minutes(timing[name]) for name in published if name in timing]
    if times:
        # and the runs its protocol holds now beyond those (another rate, more seeds), at their mean
        more = [run.name for run in experiment.all_runs(published_results(experiment.folder, results_dir, experiment.name))
                if run.name not in published]
        mean = sum(times) / len(times)
        return (len(published) + len(more), sum(times) + mean * (len(published) + len(more) - len(times)),
                f"{experiment.folder}/{TIMING}: the {len(published)} runs it published"
                + (f", {len(more)} more that its protocol holds now at their mean" if more else ""))
    assumed = experiment.assumed_runs()
    layers, found, per_layer = _per_layer(assumed, timing)
    if not found:
        return len(assumed), experiment.minutes, "a first guess (results/protocols.md): no run of it has recorded its time"
    # A run recorded at another rate than assumed stands in for the assumed run of its arm and seed, where the
    # arm runs that seed at one rate: seeds 2 and 3 at the chosen rate, torchscale's arm beside DeepNorm's choice.
    ran = {_arm_seed(name, timing[name]) for name in found}
    rates = collections.Counter(_run_arm_seed(run) for run in assumed)
    rest = [run for run in assumed if run.name not in found
            and not (rates[_run_arm_seed(run)] == 1 and _run_arm_seed(run) in ran)]
    minutes = sum(found.values()) + sum(per_layer * layers[run.recipe] for run in rest)
    return (len(found) + len(rest), minutes, f"{experiment.folder}/{TIMING}: {len(found)} run"
            f"{'s' if len(found) > 1 else ''} recorded, {len(rest)} more at their minutes per layer")


def _arm_seed(name, entry):
    """(arm, seed) of the timing.json entry of run `name`: the fields it records (`_record_time`)."""
    return entry.get("arm", name), entry.get("seed", 1)


def _run_arm_seed(run):
    return run.recipe, getattr(run.spec, "seed", 1)


def _layers(model):
    """What a run's time is taken to grow with, from its spec's model part: a translation model's layers,
    encoder and decoder (1 for other jobs)."""
    return getattr(model, "encoder_layers", 0) + getattr(model, "decoder_layers", 0) or 1


def _per_layer(runs, timing):
    """({arm: layers} of `runs`, {run: minutes here} of the timing.json entries of those arms, the minutes
    per layer those took; None without any)."""
    layers = {run.recipe: _layers(run.spec.model) for run in runs}
    found = {name: _minutes(entry) for name, entry in timing.items() if _arm_seed(name, entry)[0] in layers}
    return layers, found, sum(found.values()) / sum(layers[_arm_seed(name, timing[name])[0]] for name in found) \
        if found else None


def run_minutes(experiment, run, results_dir):
    """The minutes `run` (a `Run` of `experiment`) is expected to take: the time it recorded (timing.json),
    else the same run's time in the experiment it stretches (`stretched`), else the minutes per layer its
    experiment's recorded runs took, else the experiment's first guess shared among its runs."""
    timing = read_timing(experiment, results_dir)
    if run.name in timing:
        return _minutes(timing[run.name])
    more = stretched(experiment, results_dir)[0] if experiment.longer_than else {}
    if run.name in more:  # the same run of another experiment, at more updates
        return more[run.name]
    _, _, per_layer = _per_layer((*experiment.assumed_runs(), run), timing)
    if per_layer is not None:
        return per_layer * _layers(run.spec.model)
    return experiment.minutes / max(1, len(experiment.assumed_runs()))


def share_left(run, run_dir):
    """The share of `run` still to train: what its saved state (state.json) leaves of its cap, 1 where it has
    none (the time a resumed run is expected to take, for --hours)."""
    state, cap = RunDir(run_dir).state() or {}, _cap(run.spec)
    done = state.get("epoch") if getattr(run.spec, "epochs", None) else state.get("updates")
    return 1.0 if not done or not cap else max(0.0, 1 - done / cap)


AFTERNOON = 240  # minutes: what the Reproduce issue asked the whole to fit on 2 cores
GPU_BENCHMARK = os.path.join("speed", "benchmark-h100.jsonl")  # under results/: `train_nmt.py --benchmark` on a GPU


def gpu_step(results_dir):
    """(seconds a train step, seconds compiling) of the measured GPU benchmark (jax, float32, 128
    sentences of 32 tokens, the paper's 6 + 6 layers of d 512 on an H100), or None where it is missing."""
    try:
        with open(os.path.join(results_dir, GPU_BENCHMARK), encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return None
    found = [line for line in lines if line.get("system") == "keras-jax" and line.get("precision") == "float32"
             and line.get("sentences") == 128]
    return (found[0]["median_step_s"], found[0]["compile_s"]) if found else None


def gpu_hours(experiment, results_dir):
    """(GPU-hours at most, where that comes from) of an experiment sized for GPUs: each run's most updates
    (its epochs at the updates an epoch its CPU run recorded; else 256) at the benchmark's step (`gpu_step`),
    times its layers over 6 where more, and one compilation a run; no validation or decoding."""
    measured = gpu_step(results_dir)
    if measured is None:
        return None, "no GPU benchmark in results/speed to time it by"
    step, compile_s = measured
    ran = published_results(experiment.longer_than[0], results_dir) if experiment.longer_than else {}
    seconds = 0.0
    for run in experiment.runs:
        result = ran.get(run.name) or {}
        per_epoch = result["updates"] / result["epochs"] if result.get("updates") and result.get("epochs") else 256
        seconds += compile_s + run.spec.epochs * per_epoch * step * max(1.0, run.spec.encoder_layers / 6)
    return seconds / 3600, (f"at most: {step * 1000:.1f} ms a step, {compile_s:.0f} s compiling a run, as "
                            f"measured on an H100 (results/{GPU_BENCHMARK.replace(os.sep, '/')}); no validation or decoding")


def make_plan(experiments, jobs, results_dir, glue_dir=None):
    """[(experiment, its runs, minutes of its runs added up, where that comes from)]; minutes None for an
    experiment that cannot run here (`cannot_run`)."""
    plan = []
    for experiment in experiments:
        if cannot_run(experiment, glue_dir):
            plan.append((experiment, len(experiment.runs), None, "skipped: it needs --glue-dir DIR, GLUE MRPC"))
        elif experiment.follow:
            plan.append((experiment, *protocol_minutes(experiment, results_dir)))
        else:
            plan.append((experiment, len(experiment.runs), *recorded_minutes(experiment, results_dir)))
    return plan


def wall_minutes(plan, jobs):
    """The plan's wall time with `jobs` runs at a time: its minutes shared among the jobs, but never less
    than its longest chain of runs that wait for each other: Figure 5(a)'s first run (whose WordPiece
    vocabulary the others read), its other runs `jobs` at a time, then MRPC."""
    plan = [entry for entry in plan if entry[2] is not None]
    total = sum(minutes for _, _, minutes, _ in plan)
    chain = 0.0
    for experiment, runs, minutes, _ in plan:
        if experiment.job in ("bert", "finetune") and runs:
            each = minutes / runs
            chain += each * (1 + math.ceil((runs - 1) / jobs))
    longest = max((minutes / max(1, runs) for _, runs, minutes, _ in plan), default=0)
    return max(total / jobs, chain, longest)


def print_gpu_plan(experiments, results_dir):
    """The experiments sized for GPUs (`Experiment.hardware`), each with its cost in GPU-hours (`gpu_hours`)."""
    if not experiments:
        return
    width = max(len(experiment.name) for experiment in experiments)
    print("on a GPU, run by name (--only NAME): the converged protocol, every arm to its plateau "
          "(results/protocols.md, 2026-11-29, 9)")
    for experiment in experiments:
        hours, source = gpu_hours(experiment, results_dir)
        cost = "-" if hours is None else f"{hours:.1f} GPU-h"
        print(f"  {experiment.name:<{width}}  {len(experiment.runs):>2} runs  {cost:>9}  {experiment.title} [{source}]",
              flush=True)


def print_plan(plan, jobs, left=None):
    """The plan, one line an experiment and the total; with `left` (`what_is_left`), what a reproduction
    that was stopped has done on today's code and the time left."""
    width = max(len(experiment.name) for experiment, _, _, _ in plan)
    print(f"plan: {len(plan)} experiment{'s' if len(plan) != 1 else ''}, {jobs} run{'s' if jobs != 1 else ''} "
          "at a time (minutes of runs, as the hosts that ran them recorded them)")
    for (experiment, runs, minutes, source), (done, _) in zip(plan, left or [(0, None)] * len(plan)):
        print(f"  {experiment.name:<{width}}  {runs:>2} run{'s' if runs != 1 else ' '}  "
              f"{'skipped' if minutes is None else hours(minutes):>8}  "
              f"{experiment.title} [{source}]" + (f" ({done} done)" if done else ""))
    total = wall_minutes(plan, jobs)
    if total > AFTERNOON:
        print(f"  (more than an afternoon's {AFTERNOON // 60} hours: the fair protocols of results/protocols.md tune "
              "each arm's rate and run 3 seeds; a stopped reproduction goes on where it stopped)")
    done = sum(count for count, _ in left or [])
    if done:
        rest = wall_minutes([(experiment, runs - count, minutes_left, source) for (experiment, runs, _, source),
                             (count, minutes_left) in zip(plan, left)], jobs)
        print(f"  total: about {hours(total)} with {jobs} slots; {done} run{'s' if done > 1 else ''} done on "
              f"today's code, about {hours(rest)} left", flush=True)
    else:
        print(f"  total: about {hours(total)} with {jobs} slots", flush=True)


def what_is_left(plan, runs_dir, results_dir):
    """[(runs of the experiment ended on today's code under `runs_dir`, minutes of runs left)] for each entry
    of `plan`: its minutes less the wall times those runs recorded (timing.json; else their share)."""
    left = []
    for experiment, runs, minutes, _ in plan:
        if minutes is None:
            left.append((0, None))
            continue
        done = ended_results(experiment, os.path.join(runs_dir, experiment.name))
        timing = read_timing(experiment, results_dir)
        spent = sum(_minutes(timing[name]) if name in timing else minutes / max(1, runs) for name in done)
        left.append((len(done), max(0.0, minutes - spent)))
    return left


def hours(minutes):
    minutes = round(minutes)  # before splitting: 359.6 minutes is "6 h 00", not "5 h 60"
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d}"


# --- running and publishing ------------------------------------------------------------------------

def reproduce(experiments, jobs, runs_dir, results_dir, glue_dir=None, catalog=None, backend=None, premises=True,
              deadline=None, gpus=0.0, *, engine):
    """Run the experiments' runs not done on today's code on `engine` (`runner.Engine`, which it leaves open), at
    most `jobs` at a time (None: as many as its resources hold), each on its experiment's backend (or
    `backend`) and threads, with a share `gpus` of a GPU where there are GPUs, and publish each experiment
    once its last run has ended; a protocol's later runs start as soon as a slot is free. `catalog` holds the
    experiments others need (MRPC reads Figure 5(a)'s runs); premises=False (--smoke) runs every stage;
    with `deadline` (a `time.time()`) no run starts that is expected to end after it. Returns (the
    experiments that ran or were done, how many runs the deadline held back)."""
    catalog = {**(catalog or {}), **{e.name: e for e in experiments}}
    runnable = runnable_here(experiments, glue_dir)
    for experiment in runnable:
        take_back(experiment, os.path.join(runs_dir, experiment.name), results_dir)
    failed, held = run_and_publish(runnable, jobs, runs_dir, results_dir, glue_dir, catalog, backend, premises,
                                   deadline, engine, gpus)
    if held:
        print(f"== --hours: {len(held)} run{'s' if len(held) > 1 else ''} would have ended after the time given, "
              "not started; run the same command again to go on", flush=True)
    refuse_failed(failed)
    return runnable, len(held)


def run_and_publish(runnable, jobs, runs_dir, results_dir, glue_dir, catalog, backend, premises, deadline, engine,
                    gpus):
    """`reproduce`'s stages on the engine's loop (`runner.drive`): the runs its protocols know so far, each
    experiment published once its runs have all ended. Returns ({task: why it failed}, the held)."""
    published, known = set(), {}  # {task: (experiment, Run)}
    expected = {}  # {task: minutes it is expected to take here}
    sharing = {}  # {task: runs at a time when it started}, recorded with its time

    def waiting(running, failed):
        """The tasks not done on today's code, less those running or failed; publishes each finished experiment.
        None starts on code this reproduction did not start on: it stops once the runs started before end."""
        if not running:
            _same_code()
        busy = {task.name for task in running.values()}
        tasks = []
        for experiment in runnable:
            out = os.path.join(runs_dir, experiment.name)
            runs = known_runs(experiment, out, premises)
            going = {run.name for run in runs if f"{experiment.name}/{run.name}" in busy}
            _forget_changed(out, [run for run in runs if run.name not in going], experiment.job)  # a starting run has no config yet
            if not going and experiment.name not in published \
                    and all(ended_here(os.path.join(out, r.name), experiment.job) for r in runs) \
                    and _needed(experiment, catalog, runs_dir, premises) is not None:
                publish_ended(experiment, runs, out, results_dir)
                published.add(experiment.name)
            found = [task for task in _tasks(experiment, runs, out, runs_dir, glue_dir, catalog, backend, premises, gpus)
                     if task.name not in busy and task.name not in failed]
            known.update({f"{experiment.name}/{run.name}": (experiment, run) for run in runs})
            if deadline:
                expected.update({task.name: run_minutes(experiment, known[task.name][1], results_dir)
                                 * share_left(known[task.name][1], task.run_dir) for task in found
                                 if task.name not in expected})
            tasks += found
        tasks.sort(key=lambda task: not RunDir(task.run_dir).holds_run())  # runs under way end first
        return tasks if not tasks or fingerprint() == code_version()["fingerprint"] else []

    def slots(task):
        return jobs or engine.slots(task.threads, task.gpus)

    def started(task):
        _record_settings(os.path.dirname(task.run_dir), known[task.name][1])
        sharing[task.name] = slots(task)

    def take(task, outcome):
        experiment, run = known[task.name]
        why = take_outcome(task, outcome, experiment, run, sharing.pop(task.name), results_dir)
        if why is None and experiment.each:
            publish_run(experiment, run, os.path.join(runs_dir, experiment.name), results_dir)
        return why

    late = deadline and (lambda task: time.time() + 60 * expected[task.name] > deadline)
    return drive(engine, waiting, slots, take, started, late)


def runnable_here(experiments, glue_dir):
    """The `experiments` that can run here; one line for each of the others (`cannot_run`)."""
    runnable = []
    for experiment in experiments:
        why = cannot_run(experiment, glue_dir)
        if why:
            print(f"{experiment.name}: skipped: {why}", flush=True)
        else:
            runnable.append(experiment)
    return runnable


def take_back(experiment, out, results_dir):
    """Put back under `out` the experiment's runs that results/FOLDER/ publishes on code that gives today's
    numbers (`restore_published`), in one line: not run again."""
    published_before = restore_published(experiment, out, results_dir)
    if published_before:
        print(f"{experiment.name}: {len(published_before)} run{'s' if len(published_before) > 1 else ''} "
              f"that {os.path.join(results_dir, experiment.folder)} publishes taken back (their code gives "
              "today's numbers): not run again", flush=True)


def publish_ended(experiment, runs, out, results_dir):
    """`publish`, and record the rules its rows are read under from now on (python results/tables.py --check)."""
    publish(experiment, runs, out, results_dir)
    tables.record_rules(os.path.dirname(results_dir), experiment.rows, datetime.date.today().isoformat())


def take_outcome(task, outcome, experiment, run, slots, results_dir):
    """Take in the `outcome` of `task`, the `run` of `experiment`, in one line: its wall time into timing.json
    (not for a run that went on from a checkpoint). Returns why it failed, or None."""
    if ended(task, outcome) is None:
        why = why_failed(task, outcome)
        print(f"== {task.name}: failed ({why})", flush=True)
        return why
    if outcome["resumed"]:  # its earlier start's time is not known
        print(f"== {task.name}: its wall time is not recorded (it went on from a checkpoint)", flush=True)
    else:
        _record_time(experiment, run, outcome["seconds"], slots, results_dir, outcome["placement"]["host"])
    return None


def cannot_run(experiment, glue_dir):
    """Why `experiment` cannot run here (one line), or None: MRPC's fine-tuning without its data."""
    if experiment.job == "finetune" and not glue_dir:
        return ("GLUE MRPC is not shipped with the project (its terms do not allow redistribution); download it "
                "(GLUE's download_glue_data.py, or Microsoft Research's MRPC release) and pass --glue-dir DIR "
                "holding MRPC/train.tsv and MRPC/dev.tsv")
    return None


# --- one reproduction per runs folder, and its runs stop with it ----------------------------------------

@contextlib.contextmanager
def only_one(runs_dir):
    """Hold `runs_dir`/.reproduce.lock while a reproduction runs there (a second one would run the same
    run folders beside it): a second one stops with one line naming the first's process. POSIX only."""
    if fcntl is None:
        yield
        return
    os.makedirs(runs_dir, exist_ok=True)
    path = os.path.join(runs_dir, ".reproduce.lock")
    while True:
        lock = open(path, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.seek(0)
            pid = lock.read().strip() or "?"
            lock.close()
            raise UsageError(f"another reproduce.py (process {pid}) is running in {runs_dir}: wait for it to end, "
                             f"or stop it (kill {pid}; its runs stop with it and go on next time), then run the "
                             "same command again") from None
        try:
            if os.path.samestat(os.fstat(lock.fileno()), os.stat(path)):
                break  # else the holder before removed the file between its open and its lock: open it anew
        except OSError:
            pass
        lock.close()
    try:
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)  # while still held: a later reproduce.py makes its own
        lock.close()


def _same_code():
    """Refuse to go on when the code changed while this reproduction ran: its runs would record other code."""
    started, now = code_version()["fingerprint"], fingerprint()
    if now != started:
        raise UsageError(f"the code changed while reproduce.py ran (fingerprint {started} at its start, {now} now): "
                         "its next runs would run on other code; run the same command again (finished runs of "
                         "today's code are kept)")


def known_runs(experiment, out, premises=True):
    """The experiment's runs known from what its ended runs under `out` gave (`Experiment.all_runs`)."""
    results = ended_results(experiment, out, premises)
    return experiment.all_runs(results, premises)


def ended_results(experiment, out, premises=True):
    """{run: results.json} of the experiment's runs under `out` that ended on today's code, stage by stage."""
    results, grown = {}, True
    while grown:
        runs = experiment.all_runs(results, premises)
        found = {run.name: RunDir(os.path.join(out, run.name)).results() for run in runs
                 if ended_here(os.path.join(out, run.name), experiment.job)}
        grown, results = len(found) > len(results), found
    return results


def _needed(experiment, catalog, runs_dir, premises):
    """[(experiment, run)] of the final runs the experiment reads from those it needs (MRPC: Figure 5(a)'s),
    or None while any of them is not known or not ended."""
    needed = []
    for need in experiment.needs:
        out = os.path.join(runs_dir, need)
        final = catalog[need].final_runs(ended_results(catalog[need], out, premises))
        if not final or not all(ended_here(os.path.join(out, name), catalog[need].job) for name in final):
            return None
        needed += [(need, name) for name in final]
    return needed


def with_needs(experiments, catalog, runs_dir):
    """`experiments`, after those they need (`Experiment.needs`) not done on today's code, named in a line."""
    names = {e.name for e in experiments}
    added = []
    for experiment in experiments:
        for need in experiment.needs:
            runs = known_runs(catalog[need], os.path.join(runs_dir, need))
            if need not in names and not all(ended_here(os.path.join(runs_dir, need, r.name), catalog[need].job)
                                             for r in runs):
                print(f"{experiment.name} needs the runs of {need}: running {need} too", flush=True)
                added.append(catalog[need])
                names.add(need)
    return added + list(experiments)


def _tasks(experiment, runs, out, runs_dir, glue_dir, catalog, backend=None, premises=True, gpus=0.0):
    """The `Task`s, named EXPERIMENT/RUN, of the experiment's `runs` not done on today's code (`ended_here`);
    MRPC's waits until the final runs of Figure 5(a) are known and ended, and reads their checkpoints."""
    settings = None
    if experiment.job == "finetune":  # the final checkpoints of the runs it needs (reproduction/worker.py)
        needed = _needed(experiment, catalog, runs_dir, premises)
        if needed is None:
            return []
        settings = dict(glue_dir=glue_dir, init=tuple(f"@{os.path.join(runs_dir, n, r)}" for n, r in needed))
    env = (("KERAS_BACKEND", backend or experiment.backend),)
    # a run ended on code certified to give today's numbers is done (BERT's first run still hands its
    # vocabulary to the later runs, which then start at once: the run they wait for is no task)
    return sweep_tasks(experiment.job, runs, out, resume=True, prefix=f"{experiment.name}/", env=env,
                       done=lambda run_dir: ended_here(run_dir, experiment.job), settings=settings,
                       threads=experiment.threads, gpus=gpus)


SPECS = "specs.json"  # in an experiment's run folder: {run: the given values of the spec it ran}


def _forget_changed(out, runs, job):
    """Remove each run folder under `out` of other code (`same_numbers`) or of other settings than the
    experiment now gives it (those it started with, specs.json): it starts afresh."""
    recorded = _read_json(os.path.join(out, SPECS)) or {}
    for run in runs:
        run_dir = os.path.join(out, run.name)
        if os.path.isdir(run_dir) and (_other_code(run_dir, job) or
                                       recorded.get(run.name, _settings(run)) != _settings(run)):
            shutil.rmtree(run_dir)


def _record_settings(out, run):
    """Record in `out`/specs.json the settings `run` starts with (or was put back with), which
    `_forget_changed` compares with the experiment's next time; a run that never started leaves nothing."""
    path = os.path.join(out, SPECS)
    os.makedirs(out, exist_ok=True)
    write_json(path, {**(_read_json(path) or {}), run.name: _settings(run)})


def _settings(run):
    """The given values of `run`'s spec, as specs.json holds them (JSON: tuples read back as lists)."""
    return json.loads(json.dumps(run.spec.flags()))


def _other_code(run_dir, job):
    """Whether the run in `run_dir` (ended or not) ran on code that gives other numbers for `job`'s rows."""
    run = RunDir(run_dir)
    result = run.results()
    try:
        config = run.config()
    except (OSError, ValueError):
        config = {}
    recorded = (result or config).get("code_version") or {}
    return not same_numbers(recorded.get("fingerprint"), job)


def ended_here(run_dir, job):
    """Whether the run in `run_dir` ended (not "stopped") on code that gives today's numbers for `job`'s rows."""
    result = RunDir(run_dir).results()
    if result is None or result.get("outcome") == "stopped":
        return False
    return same_numbers((result.get("code_version") or {}).get("fingerprint"), job)


def same_numbers(found, job):
    """Whether code of fingerprint `found` gives today's numbers for the rows of `job`: it is today's, or both
    are certified (`reproduce.py --certify`) to give the numbers of one code."""
    today = code_version()["fingerprint"]
    if found == today:
        return True
    if not found:
        return False
    job = {"finetune": "bert"}.get(job, job)
    return certified_as(found, ROOT, job) == certified_as(today, ROOT, job)


def _record_time(experiment, run, seconds, jobs, results_dir, host=None):
    """`run`'s wall time in results/FOLDER/timing.json, with its arm and seed, its host and the host's CPU."""
    path = os.path.join(results_dir, experiment.folder, TIMING)
    timing = _read_json(path) or {}
    arm, seed = _run_arm_seed(run)
    timing[run.name] = dict(wall_s=round(seconds, 1), jobs=jobs, arm=arm, seed=seed, cpu=cpu_name(),
                            **({"host": host} if host else {}))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_json(path, timing)


def restore_published(experiment, out, results_dir):
    """Put back under `out` each run that results/FOLDER/ publishes for a translation protocol, or for an
    experiment published run by run, and that it still runs as then (`_same_run`) on code that gives today's
    numbers: a protocol that grows, or a campaign that was stopped, runs only its new runs. Returns the
    names put back."""
    folder = os.path.join(results_dir, experiment.folder)
    listed = os.path.join(folder, f"runs-{experiment.name}.csv")
    if not (experiment.each or (experiment.job == "translation" and experiment.follow)) or not os.path.exists(listed):
        return []
    published = {row["run"]: row for row in read_csv(listed)
                 if os.path.exists(os.path.join(folder, f"{row['run']}.json"))
                 and os.path.exists(os.path.join(folder, f"{row['run']}.csv"))}
    results = {name: _read_json(os.path.join(folder, f"{name}.json")) for name in published}
    restored = []
    for run in experiment.all_runs(results):
        row, result, run_dir = published.get(run.name), results.get(run.name), os.path.join(out, run.name)
        if row is None or not result or ended_here(run_dir, experiment.job):
            continue
        if not _same_run(experiment, run, row, result) \
                or not same_numbers((result.get("code_version") or {}).get("fingerprint"), experiment.job):
            continue
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        _copy(os.path.join(folder, f"{run.name}.json"), RunDir(run_dir).file(RESULTS))
        _copy(os.path.join(folder, f"{run.name}.csv"), RunDir(run_dir).file(METRICS))
        _record_settings(out, run)
        restored.append(run.name)
    return restored


def publish_run(experiment, run, out, results_dir):
    """Publish one ended run of an experiment published run by run (`Experiment.each`) into results/FOLDER/:
    its results.json and metrics.csv as RUN.json and RUN.csv, and its row of runs-NAME.csv (in the
    experiment's order), so that a campaign stopped later loses only the runs under way
    (`restore_published` takes it back)."""
    folder = os.path.join(results_dir, experiment.folder)
    os.makedirs(folder, exist_ok=True)
    run_dir = RunDir(os.path.join(out, run.name))
    _copy(run_dir.file(RESULTS), os.path.join(folder, f"{run.name}.json"))
    _copy(run_dir.file(METRICS), os.path.join(folder, f"{run.name}.csv"))
    listed = os.path.join(folder, f"runs-{experiment.name}.csv")
    names = {row["run"] for row in read_csv(listed)} | {run.name}
    write_csv(listed, [dict(run=r.name, arm=r.recipe, lr=r.spec.lr, seed=r.spec.seed, cap=_cap(r.spec))
                       for r in experiment.runs if r.name in names])
    draw_ended(experiment, folder, names)
    print(f"== {experiment.name}/{run.name}: published in {folder}", flush=True)


def draw_ended(experiment, folder, names):
    """Until its last run ends, an experiment published run by run draws the runs `names` that ended, one line
    each (arm, rate, seed) to where it stopped, into the figure its protocol's mean curves take at the end
    (curves-NAME.png; BERT's curves.png: `draw_protocol`)."""
    curves = {f"{run.recipe}, lr {run.spec.lr:g}, seed {run.spec.seed}":
              read_csv(os.path.join(folder, f"{run.name}.csv")) for run in experiment.runs if run.name in names}
    panels = [(f"{label}, the {len(names)} run{'s' if len(names) > 1 else ''} ended", lines)
              for label, lines in curve_panels(curves, experiment.job)]
    figure = "curves.png" if experiment.job == "bert" else f"curves-{experiment.name}.png"  # draw_protocol's name
    plot_panels(os.path.join(folder, figure), "updates", panels)


def _cap(spec):
    """The most a run may train: its epochs (translation) or updates (BERT); a linear decay stretches over it."""
    return getattr(spec, "epochs", None) or getattr(spec, "steps", None)


def _same_run(experiment, run, row, result):
    """Whether the published `row` (runs-NAME.csv) and `result` (RUN.json) are `run` as the experiment runs it
    now: its rate and seed, its name of settings, its cap where runs-NAME.csv records one (a run published run
    by run), and for translation its layers and its epochs (all of them, or fewer where it stopped at its
    plateau)."""
    spec = run.spec
    if (float(row["lr"]), int(row["seed"])) != (spec.lr, spec.seed) or result.get("run") != spec.name() \
            or row.get("cap", str(_cap(spec))) != str(_cap(spec)):
        return False
    if experiment.job != "translation":
        return True
    stopped_early = result.get("plateau_at") and result.get("epochs", 0) <= spec.epochs
    return result.get("layers") == [spec.encoder_layers, spec.decoder_layers] \
        and (result.get("epochs") == spec.epochs or bool(stopped_early))


def publish(experiment, runs, out, results_dir):
    """Copy what the Results table reads from the run folders of `runs` under `out` into results/FOLDER/,
    with the experiment's tables and plots; a protocol's runs-NAME.csv lists each run's arm, rate and seed."""
    first = RunDir(os.path.join(out, runs[0].name))
    folder = os.path.join(results_dir, experiment.folder)
    os.makedirs(folder, exist_ok=True)
    if experiment.follow:
        write_csv(os.path.join(folder, f"runs-{experiment.name}.csv"),
                  [dict(run=run.name, arm=run.recipe, lr=run.spec.lr, seed=run.spec.seed) for run in runs])
    if experiment.copies:
        for name in experiment.copies:
            _copy(first.file(name), os.path.join(folder, name))
    elif experiment.job == "translation":
        for run in runs:
            _copy(RunDir(os.path.join(out, run.name)).file(RESULTS), os.path.join(folder, f"{run.name}.json"))
            _copy(RunDir(os.path.join(out, run.name)).file(METRICS), os.path.join(folder, f"{run.name}.csv"))
        summarize("translation", experiment.name, runs, out, folder, plot=not experiment.follow)
        if experiment.follow:
            draw_protocol(experiment, runs, out, results_dir, CURVES["translation"])
    elif experiment.job == "bert":
        final = experiment.final and experiment.final_runs({r.name: RunDir(os.path.join(out, r.name)).results()
                                                             for r in runs})
        # Figure 5(a)'s measure between the two recipes at their chosen rates (seed 1)
        summarize("bert", experiment.name, runs, out, folder, pair=final or None, plot=not experiment.follow)
        if experiment.follow:
            draw_protocol(experiment, runs, out, results_dir, CURVES["bert"])
    elif experiment.job == "finetune":
        _copy(first.file("results.csv"), os.path.join(folder, f"{runs[0].name}.csv"))  # glue.py's table and plot
        _copy(first.file("finetune.png"), os.path.join(folder, f"{runs[0].name}.png"))
    else:  # an analysis: its tables and figures
        for name in sorted(os.listdir(first.path)):
            if name.endswith((".csv", ".json", ".png")) and name not in (RESULTS, CONFIG, PLACEMENT):
                _copy(first.file(name), os.path.join(folder, name))
    print(f"== {experiment.name}: published in {folder}", flush=True)


def draw_protocol(experiment, runs, out, results_dir, keys):
    """A protocol's figures (`plot_protocol`): each arm at its chosen rate, and the rate grids."""
    bert = experiment.job == "bert"
    arms = tables.protocol_arms(os.path.dirname(os.path.abspath(results_dir)), experiment.folder,
                                         f"{experiment.folder}/results.csv" if bert else None)
    curves = {run.name: RunDir(os.path.join(out, run.name)).rows() for run in runs}
    score = ("final_valid_accuracy", "final masked-LM accuracy") if bert else ("test_tokenized_bleu", "test BLEU")
    plot_protocol(arms, curves, keys, score, os.path.join(results_dir, experiment.folder),
                  "" if bert else experiment.name)


def _copy(source, target):
    shutil.copyfile(source, target + ".partial")
    os.replace(target + ".partial", target)


# --- verdicts ----------------------------------------------------------------------------------------

def verdicts(experiments, root):
    """[(claim, verdict)] of the Results table's rows that judge `experiments`, from root/results/."""
    rows = []
    for function in dict.fromkeys(name for experiment in experiments for name in experiment.rows):
        try:
            made = getattr(tables, function)(root)
        except (OSError, KeyError, ValueError, IndexError, StopIteration, ZeroDivisionError, TypeError) as error:
            rows.append((function, f"not judged: its files are missing or incomplete ({type(error).__name__})"))
            continue
        rows += [(row[0], row[2]) for row in (made if isinstance(made, list) else [made])]
    return rows


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
