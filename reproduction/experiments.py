"""The Results table's experiments as data: for each, its runs (specs, with a seeds axis), the rows of
the table it fills and the rules that judge them, its results/ folder and its figures. Without Keras.

    EXPERIMENTS["fig2"].runs                       # (Run(name, spec, arm), ...): exactly what the row measured
    EXPERIMENTS["fig2"].smoke().runs                # the same pipeline at the tiny size (reproduce.py --smoke)
    sweep_runs("fig2", TranslationSpec.build(preset="iwslt"))   # train_nmt.py --sweep fig2 --preset iwslt
    sweep_runs("depth", base, depths=(6, 12, 24))               # --depths overrides the experiment's own

A sweep's run is the command line's spec with the run's own settings on top, so any flag the user gives
applies to every run but those it would blur (docs/translation.md, Sweeps). The rules are the row
functions of reproduction/tables.py named in `rows`.
"""

import dataclasses
import json
import math
import os
from dataclasses import dataclass

from harness import rundir
from harness.files import read_csv
from harness.specs import BERT_SWEEPS, NORMS, SWEEPS, AnalysisSpec, BertSpec, TranslationSpec


@dataclass(frozen=True)
class Run:
    """One run of an experiment: its name (its run directory, and its files' names in results/), its spec
    (which holds its rate and seed) and, in a protocol, its arm (the recipe whose rate is tuned; "": the
    run is its own arm). Code reads the fields; the name only names folders and files."""

    name: str
    spec: object
    arm: str = ""

    @property
    def recipe(self):
        return self.arm or self.name


def protocol_run(arm, spec):
    """The run of `arm` at `spec`'s rate and seed, named ARM-lrRATE (seed 1) or ARM-lrRATE-seedN."""
    seed = getattr(spec, "seed", 1)
    return Run(f"{arm}-lr{rate(spec.lr)}" + (f"-seed{seed}" if seed != 1 else ""), spec, arm)


def rate(value):
    """A learning rate as run names write it: 1e-3, 5e-4, 1.5e-3."""
    mantissa, exponent = f"{value:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def seeded(runs, seeds):
    """The seeds axis: each run once per seed; seed 1 keeps the run's name, seed n adds "-seedn"."""
    return tuple(Run(run.name if seed == 1 else f"{run.name}-seed{seed}", run.spec.but(seed=seed), run.arm)
                 for seed in seeds for run in runs)


# --- train_nmt.py --sweep ---------------------------------------------------------------------------


SWEEP_SETTINGS = {
    # The paper-scale presets' sweeps (the cpu preset's are the protocols below, `protocol_sweep`).
    # short_warmup: Figure 2's 500 of 4,000 warmup updates.
    # The paper (Section 3.2): Adam at lr_max 5e-4 and 1e-3 with warmup 4000, 500 and 1 (none), SGD at 5e-3
    # and 1e-3 with warmup 4000 and none, inverse sqrt after the warmup in every run; DeepNet's depths.
    "iwslt": dict(lr=5e-4, warmup=4000, fig2_lrs=[5e-4, 1e-3], fig2_schedule="inverse_sqrt", control_lr=5e-4,
                  short_warmup=500, fig2_sgd_lrs=[5e-3, 1e-3], depths=(6, 12, 24, 48),
                  depth_seeds=(1,), depth=dict(schedule="inverse_sqrt", lr=5e-4)),
    # WMT14 (Section 4, Figure 4(c, d)): Pre-LN without warmup at lr 7e-4 and 1.5e-3, held until epoch 6
    # then inverse sqrt, against Post-LN with warmup 4000 at the same lr_max; RAdam was tried on IWSLT14
    # only. fig2 is Figure 2's design (Section 3.2, IWSLT14 in the paper) at the WMT14 rates.
    "wmt14": dict(lr=7e-4, warmup=4000, fig2_lrs=[7e-4, 1.5e-3], fig2_schedule="inverse_sqrt", control_lr=7e-4,
                  short_warmup=500, fig2_sgd_lrs=[5e-3, 1e-3], fig4_lrs=[7e-4, 1.5e-3],
                  fig4_pre_schedule="decay_then_inverse_sqrt", fig4_radam=False,
                  depths=(6, 12, 24, 48), depth_seeds=(1,), depth=dict(schedule="inverse_sqrt", lr=7e-4)),
    # For tests: every run's pipeline in seconds.
    "tiny": dict(lr=5e-4, warmup=2, fig2_lrs=[5e-4], fig2_schedule="inverse_sqrt", control_lr=5e-4, short_warmup=1,
                 fig2_sgd_lrs=[5e-3], depths=(1, 2), depth_seeds=(1,),
                 depth=dict(schedule="constant", warmup_steps=2)),
}


def sweep_runs(name, base, depths=None):
    """The runs of train_nmt.py's sweep `name` ("fig2", "fig4" or "depth") for the command line's spec
    `base`: at the cpu preset its protocol's (`protocol_sweep`), else those of `SWEEP_RUNS` under the preset's
    `SWEEP_SETTINGS` (docs/translation.md, Sweeps):

    fig2   Figure 2 (Section 3.2): Adam, Post-LN with warmup, the short warmup (500 of 4,000) and none, and
           Pre-LN without, at each rate of `fig2_lrs`; SGD, Post-LN with warmup and without, at each of
           `fig2_sgd_lrs`. Under inverse sqrt (the paper's "warmup = 1") the rate is smaller without
           warmup, so Post-LN and Pre-LN at a constant `control_lr` are the control of the placement.
    fig4   Figure 4 (Section 4): Pre-LN without warmup (`fig4_pre_schedule`) against Post-LN with warmup at
           each rate of `fig4_lrs`, and, where `fig4_radam`, both with RAdam without warmup.
    depth  DeepNet (Figure 1, Table 1): Post-LN, Pre-LN and DeepNorm at each depth of `depths`."""
    if name not in SWEEPS:
        raise ValueError(f"no sweep {name!r}; choose from {', '.join(SWEEPS)}")
    if base.preset == "cpu":
        return protocol_sweep(name, base, depths)
    s = SWEEP_SETTINGS[base.preset]
    user = {k: v for k, v in base.flags().items() if k not in ("out", "resume")}

    def run(run_name, defaults, **own):
        return Run(run_name, TranslationSpec.build(**{**defaults, **user, **own}))

    return SWEEP_RUNS[name](s, run, base, depths)


def _fig2_sweep(s, run, base, depths):
    defaults, schedule = dict(warmup_steps=s["warmup"]), s["fig2_schedule"]
    runs = [r for lr in s["fig2_lrs"] for r in (
        run(f"post-warmup-lr{rate(lr)}", defaults, norm="post", lr=lr, schedule=schedule),
        run(f"post-nowarmup-lr{rate(lr)}", defaults, norm="post", lr=lr, schedule=schedule, no_warmup=True),
        run(f"pre-nowarmup-lr{rate(lr)}", defaults, norm="pre", lr=lr, schedule=schedule, no_warmup=True),
        run(f"post-warmup{s['short_warmup']}-lr{rate(lr)}", defaults, norm="post", lr=lr, schedule=schedule,
            warmup_steps=s["short_warmup"]))]
    runs += [r for lr in s["fig2_sgd_lrs"] for r in (
        run(f"post-sgd-warmup-lr{rate(lr)}", defaults, norm="post", optimizer="sgd", lr=lr, schedule=schedule),
        run(f"post-sgd-nowarmup-lr{rate(lr)}", defaults, norm="post", optimizer="sgd", lr=lr, schedule=schedule,
            no_warmup=True))]
    if schedule == "inverse_sqrt":
        runs += [run(f"{norm}-constant-lr{rate(s['control_lr'])}", defaults, norm=norm, lr=s["control_lr"],
                     schedule="constant", no_warmup=True) for norm in ("post", "pre")]
    return tuple(runs)


def _fig4_sweep(s, run, base, depths):
    defaults, pre = dict(warmup_steps=s["warmup"]), s.get("fig4_pre_schedule", "step")
    runs = [r for lr in s.get("fig4_lrs", [s["lr"]]) for r in (
        run(f"post-warmup-lr{rate(lr)}", defaults, norm="post", lr=lr, schedule="inverse_sqrt"),
        run(f"pre-nowarmup-lr{rate(lr)}", defaults, norm="pre", lr=lr, schedule=pre, no_warmup=True))]
    if s.get("fig4_radam", True):
        runs += [run(f"{norm}-radam-nowarmup", defaults, norm=norm, lr=s["lr"], optimizer="radam",
                     schedule="linear", no_warmup=True) for norm in ("post", "pre")]
    return tuple(runs)


def _depth_sweep(s, run, base, depths):
    runs = [run(f"{norm}-{depth}L", s["depth"], norm=norm, encoder_layers=depth, decoder_layers=depth)
            for depth in (depths or s["depths"]) for norm in ("post", "pre", "deepnorm")]
    return seeded(runs, (base.seed,) if "seed" in base.given else s["depth_seeds"])


# train_nmt.py --sweep NAME at a paper-scale preset: the function that lists its runs (`sweep_runs`)
SWEEP_RUNS = dict(zip(SWEEPS, (_fig2_sweep, _fig4_sweep, _depth_sweep)))


# The fields a protocol's run sets itself: a flag the user gives for one of them would blur the run.
OWN = ("norm", "lr", "optimizer", "schedule", "no_warmup", "warmup_steps", "encoder_layers", "decoder_layers",
       "deepnorm_rule", "seed", "out", "resume")


def protocol_sweep(name, base, depths=None):
    """`--sweep NAME` at the cpu preset: the first stage of the experiment's protocol (results/protocols.md),
    or what its `Protocol.sweep` lists (depth: every arm's grid, at the depths `depths`), with the user's
    flags on top of each run but those it sets itself (`OWN`); `--seed N` runs that seed.
    reproduce.py --only NAME runs the whole protocol: the other seeds at each chosen rate too."""
    made = EXPERIMENTS[name].protocol()
    runs = made.sweep(depths) if made.sweep else made.runs
    user = {k: v for k, v in base.flags().items() if k not in OWN}
    seed = {"seed": base.seed} if "seed" in base.given else {}
    return tuple(dataclasses.replace(run, spec=run.spec.but(**user, **seed)) for run in runs
                 if not seed or run.spec.seed == 1)


# --- pretrain_bert.py --sweep fig5 ------------------------------------------------------------------

def bert_sweep_runs(name, base):
    """pretrain_bert.py's sweep: Figure 5(a)'s two recipes for the command line's spec `base`; at the cpu
    preset, each at every rate of its protocol's grid (results/protocols.md: reproduce.py --only fig5 runs
    the rest)."""
    if name != "fig5":
        raise ValueError(f"no sweep {name!r}; choose from {', '.join(BERT_SWEEPS)}")
    user = {k: v for k, v in base.flags().items() if k not in ("out", "resume", "recipe", "norm", "lr", "no_warmup",
                                                               "vocab")}
    if base.preset == "cpu":
        return tuple(dataclasses.replace(run, spec=run.spec.but(**user)) for run in fig5_protocol().runs)
    return (Run("post-warmup", BertSpec.build(**user, recipe="post-warmup")),
            Run("pre-no-warmup", BertSpec.build(**user, recipe="pre-no-warmup", no_warmup=True)))


# --- tuned arms (results/protocols.md) ---------------------------------------------------------------

@dataclass(frozen=True)
class Arm:
    """One arm of a fair comparison (results/protocols.md): a recipe whose peak learning rate is chosen
    from `rates` by the final validation loss of seed 1 (ties: the smaller rate), then run again with the
    other `seeds` at that rate. Its runs are named ARM-lrRATE, and ARM-lrRATE-seedN."""

    name: str
    spec: object
    rates: tuple
    seeds: tuple = (1, 2, 3)

    def run(self, lr):
        return protocol_run(self.name, self.spec.but(lr=lr))

    def grid(self):
        """Seed 1 at every rate of the grid."""
        return tuple(self.run(lr) for lr in self.rates)

    def seeded(self, lr):
        """The other seeds at rate `lr`."""
        return seeded((self.run(lr),), self.seeds)[1:]

    def widened(self, results, eligible=None):
        """(the rates run so far, the chosen rate or None while runs are missing), by the edge rule: a best
        rate at the edge of those run adds twice it (or half it), at most EDGE_STEPS times. With `eligible`
        (a test of a results.json), only the rates whose runs pass it may be chosen; None if none does."""
        rates = sorted(self.rates)
        while True:
            ended = [results.get(self.run(lr).name) for lr in rates]
            if any(result is None for result in ended):
                return rates, None
            losses = [(final_loss(result), lr) for lr, result in zip(rates, ended) if not eligible or eligible(result)]
            if not losses:
                return rates, None
            best = min(losses)[1]
            if len(rates) < 2 or len(rates) - len(self.rates) >= EDGE_STEPS or rates[0] < best < rates[-1]:
                return rates, best
            rates = rates + [2 * best] if best == rates[-1] else [best / 2] + rates

    def tried(self, results):
        """Seed 1 at every rate run so far, the grid's and those the edge rule added."""
        return tuple(self.run(lr) for lr in self.widened(results)[0])


EDGE_STEPS = 3  # results/protocols.md, the edge rule


def final_loss(result):
    """A run's final validation loss for choosing a rate, from its results.json or its row of a results
    table (where a missing value is ""): infinite for a run that diverged or has none."""
    loss = (result or {}).get("final_valid_loss")
    if not result or result.get("outcome") == "diverged" or loss in (None, "") or float(loss) != float(loss):
        return float("inf")
    return float(loss)


def chosen(arm, results):
    """The rate of `arm`'s grid, widened by the edge rule, with the lowest final validation loss (ties: the
    smaller), once every run it needs has ended (`results`: {run name: results.json}); None before."""
    return arm.widened(results)[1]


def test_bleu(result):
    """Tokenized test BLEU of a results.json or a results table's row; 0 for a run that diverged or has none."""
    if not result or result.get("outcome") == "diverged":
        return 0.0
    return float(result.get("test_tokenized_bleu") or 0.0)


def sized(arm, small):
    """`arm`, or with `small` (reproduce.py --smoke) its first rate and seeds 1-2: every stage, fewest runs
    (how a rate is chosen from a grid is tested on its own, tests/test_reproduce.py)."""
    return dataclasses.replace(arm, rates=arm.rates[:1], seeds=arm.seeds[:2]) if small else arm


@dataclass(frozen=True)
class Protocol:
    """A protocol in stages: the runs known before any result, `follow(results, premises)` -> the later
    runs that the ended runs call for, `final(results)` -> the runs that stand for it (or None), and
    `sweep(depths)` -> the runs of `train_nmt.py --sweep` at the cpu preset (None: `runs`)."""

    runs: tuple
    follow: object
    final: object = None
    sweep: object = None


def tuned(arms):
    """Arms tuned independently: every grid first, then the other seeds at each arm's chosen rate."""
    def follow(results, premises=True):
        return tuple(run for arm in arms for run in later(arm, results))
    return Protocol(tuple(run for arm in arms for run in arm.grid()), follow)


def later(arm, results):
    """An arm's runs after its grid: those the edge rule adds, then the other seeds at its chosen rate."""
    lr = chosen(arm, results)
    return arm.tried(results)[len(arm.rates):] + (arm.seeded(lr) if lr is not None else ())


# Figure 4 (results/protocols.md, 1): five arms, 4 + 4 layers, 3 epochs, validation every 32 updates.
FIG4_RATES = (5e-4, 1e-3, 2e-3)


def fig4_arms(small=False, base=None):
    base = (base or TranslationSpec.build()).but(eval_every=32)
    linear = dict(schedule="linear", no_warmup=True)
    return [sized(arm, small) for arm in (
        Arm("post-adam-warmup", base.but(norm="post", schedule="inverse_sqrt", warmup_steps=300), FIG4_RATES),
        Arm("post-adam-nowarmup", base.but(norm="post", **linear), FIG4_RATES),
        Arm("post-radam", base.but(norm="post", optimizer="radam", **linear), FIG4_RATES),
        Arm("pre-adam-nowarmup", base.but(norm="pre", no_warmup=True), FIG4_RATES),
        Arm("pre-radam", base.but(norm="pre", optimizer="radam", **linear), FIG4_RATES))]


def fig4_protocol(small=False, base=None):
    return tuned(fig4_arms(small, base))


# Figure 4 at twice its budget (results/protocols.md, 2026-11-29, 2): the five arms at the rates Figure 4's
# protocol chose (its runs published in results/fig4), seeds 1-3, 6 epochs (1,536 updates).
FIG4_LONG_EPOCHS = 6
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def published(folder, results_dir=RESULTS, name=None):
    """{run: results.json} of the runs a protocol published in results/FOLDER, as its runs-NAME.csv lists
    them (NAME: the experiment's, by default the folder's); a run without its RUN.json (BERT's) by its row of
    results.csv. {} before it has published."""
    path = os.path.join(results_dir, folder)
    table = {row["run"]: row for row in read_csv(os.path.join(path, "results.csv"))}
    found = {}
    for row in read_csv(os.path.join(path, f"runs-{name or folder}.csv")):
        try:
            with open(os.path.join(path, f"{row['run']}.json"), encoding="utf-8") as f:
                found[row["run"]] = json.load(f)
        except (OSError, ValueError):
            found[row["run"]] = table.get(row["run"], {})
    return found


def fig4_long_protocol(small=False, base=None, results_dir=RESULTS):
    """Figure 4's arms (`fig4_protocol`) at 6 epochs, each at the rate Figure 4 chose for it: no runs until
    Figure 4 has published. With `small` (--smoke), the first arm's seeds 1 and 2."""
    results = published("fig4", results_dir)
    runs = ()
    for arm in fig4_arms(False, base)[:1 if small else None]:
        lr = chosen(arm, results)
        if lr is not None:
            longer = dataclasses.replace(arm, spec=arm.spec.but(epochs=FIG4_LONG_EPOCHS))
            runs += seeded((longer.run(lr),), longer.seeds[:2 if small else None])
    return Protocol(runs, None)


# Figure 2 (results/protocols.md, 2 and 3): 6 + 6 layers, 5 epochs, constant rate after the warmup.
FIG2_SGD_RATES = (0.01, 0.03, 0.1, 0.3)
FIG2_SGD_PREMISE = 10.0  # test BLEU the SGD run with warmup must reach for warmup to matter


def sgd_trains(result):
    """Figure 2(c, d)'s premise, by which SGD's rate is chosen here and judged in reproduction/tables.py: the run
    with warmup reaches FIG2_SGD_PREMISE test BLEU."""
    return test_bleu(result) >= FIG2_SGD_PREMISE


# Adam at the paper's two rates (Section 3.2), each arm with 3 seeds (results/protocols.md, 2026-11-29, 5).
FIG2_RATES = (1e-3, 5e-4)


def fig2_protocol(small=False, base=None):
    base = (base or TranslationSpec.build()).but(encoder_layers=6, decoder_layers=6, epochs=5, schedule="constant",
                                                 warmup_steps=300)
    seeds, rates = (1, 2, 3)[:2 if small else 3], FIG2_SGD_RATES[:1 if small else 4]
    first = seeded([run for lr in FIG2_RATES[:1 if small else None] for run in (
        protocol_run("post-warmup", base.but(lr=lr, norm="post")),
        protocol_run("post-warmup38", base.but(lr=lr, norm="post", warmup_steps=38)),
        protocol_run("post-nowarmup", base.but(lr=lr, norm="post", no_warmup=True)),
        protocol_run("pre-nowarmup", base.but(lr=lr, norm="pre", no_warmup=True)))], seeds)
    sgd = base.but(norm="post", optimizer="sgd")
    warm = Arm("post-sgd-warmup", sgd, rates)

    def cold(lr):
        return protocol_run("post-sgd-nowarmup", sgd.but(lr=lr, no_warmup=True))

    def follow(results, premises=True):
        # the grid, widened by the edge rule among the rates that train (the premise)
        tried, best = warm.widened(results, lambda result: sgd_trains(result) or not premises)
        widened = tuple(warm.run(lr) for lr in tried if lr not in rates)
        if best is None:
            return widened  # waiting, or the premise fails: not testable at this scale
        return widened + (cold(best), cold(2 * best)) + seeded((warm.run(best), cold(best)), seeds)[2:]

    return Protocol(first + warm.grid(), follow)


# DeepNet (results/protocols.md, 4): warmup 256 then inverse sqrt, 4 epochs, d 128, 6 and 12 layers.
DEPTH_RATES = (2.5e-4, 5e-4, 1e-3)
DEPTH_PREMISE = 15.0  # test BLEU 6-layer Post-LN must reach (reproduction/tables.py's DEPTH_MIN_BLEU is it)


def depth_trains(result):
    """DeepNet's premise, before any other arm runs: 6-layer Post-LN at its chosen rate reaches DEPTH_PREMISE."""
    return test_bleu(result) >= DEPTH_PREMISE


def depth_protocol(small=False, base=None, depths=(6, 12)):
    base = (base or TranslationSpec.build()).but(schedule="inverse_sqrt", warmup_steps=256, epochs=4)

    def arm(norm, depth, rule=None):
        spec = base.but(norm=norm, encoder_layers=depth, decoder_layers=depth,
                        **({"deepnorm_rule": rule} if rule else {}))
        return sized(Arm(f"{norm}{'-' + rule if rule else ''}-{depth}L", spec, DEPTH_RATES), small)

    premise = arm("post", depths[0])
    others = [arm(norm, depth) for depth in depths for norm in NORMS][1:]

    def follow(results, premises=True):
        runs = list(premise.tried(results)[len(premise.rates):])
        lr = chosen(premise, results)
        if lr is None or (premises and not depth_trains(results.get(premise.run(lr).name))):
            return tuple(runs)  # waiting for the premise, or it fails: not testable at this scale
        runs += premise.seeded(lr)
        for a in others:
            runs += a.grid() + later(a, results)
            best = chosen(a, results)
            if best is not None and a.spec.norm == "deepnorm":  # torchscale's constants beside, same rate
                beside = arm("deepnorm", a.spec.encoder_layers, "torchscale")
                runs += seeded((beside.run(best),), beside.seeds)
        return tuple(runs)

    def sweep(given=None):  # every placement's grid at every depth
        return tuple(run for depth in given or depths for norm in NORMS for run in arm(norm, depth).grid())

    return Protocol(premise.grid(), follow, sweep=sweep)


# Figure 5(a) (results/protocols.md, 5): each BERT recipe at its own rate, 1,000 updates.
FIG5_RATES = (1e-4, 3e-4, 1e-3, 3e-3)


def loss_ratio(post_rows, pre_rows):
    """Figure 5(a)'s measure: Post-LN's last update over the first at which Pre-LN's validation loss is at
    or below Post-LN's final one (None if never)."""
    def losses(rows):
        return [(int(r["updates"]), float(r["valid_loss"])) for r in rows if r.get("valid_loss") not in (None, "")]
    post = [(u, loss) for u, loss in losses(post_rows) if loss == loss]
    if not post:
        return None
    pre = next((u for u, loss in losses(pre_rows) if loss <= post[-1][1]), None)
    return post[-1][0] / pre if pre else None


def fig5_protocol(small=False, base=None):
    base = (base or BertSpec.build()).but(steps=1000, warmup_steps=100)
    post, pre = (sized(arm, small) for arm in (
        Arm("post-warmup", base.but(recipe="post-warmup"), FIG5_RATES),
        Arm("pre-no-warmup", base.but(recipe="pre-no-warmup", no_warmup=True), FIG5_RATES)))

    def final(results):
        rates = chosen(post, results), chosen(pre, results)
        return None if None in rates else (post.run(rates[0]).name, pre.run(rates[1]).name)

    def follow(results, premises=True):
        # seeds 2 and 3 at each recipe's chosen rate, whatever the ratio (results/protocols.md, 2026-11-29, 4)
        widened = post.tried(results)[len(post.rates):] + pre.tried(results)[len(pre.rates):]
        if final(results) is None:
            return widened
        return widened + post.seeded(chosen(post, results)) + pre.seeded(chosen(pre, results))

    return Protocol(post.grid() + pre.grid(), follow, final)


# --- the converged protocol for bigger hardware (results/protocols.md, 2026-11-29, 9): DeepNet's depth ------

CONVERGED_TIMES = 10  # at most ten times the CPU experiment's epochs
PLATEAU = dict(eval_every=0, patience=5, min_delta=0.01)  # validated every epoch, stopped at the plateau


def at_chosen_rates(name, protocol, results_dir=RESULTS):
    """The runs of a published protocol that stand for its arms: every seed at each rate where it ran more
    than one (each arm's chosen rate; Figure 2's fixed Adam rates), in the order the protocol lists them."""
    listed = read_csv(os.path.join(results_dir, name, f"runs-{name}.csv"))
    seeded_at = {(row["arm"], float(row["lr"])) for row in listed if int(row["seed"]) > 1}
    made = protocol()
    runs = made.runs + (made.follow(published(name, results_dir)) if made.follow else ())
    return tuple(run for run in runs if (run.recipe, run.spec.lr) in seeded_at)


def converged_protocol(name, protocol, results_dir=RESULTS):
    """`protocol(small)` for the converged experiment of the published protocol `name`: its runs at the
    chosen rates (`at_chosen_rates`), each trained to its plateau (`PLATEAU`), at most CONVERGED_TIMES times
    its epochs (linear decay stretched to that length). With `small` (--smoke), its first run."""
    def made(small=False, base=None):
        runs = at_chosen_rates(name, protocol, results_dir)[:1 if small else None]
        return Protocol(tuple(dataclasses.replace(run, spec=run.spec.but(epochs=CONVERGED_TIMES * run.spec.epochs, **PLATEAU))
                              for run in runs), None)
    return made


# --- the converged protocol on the CPU (results/protocols.md, 2026-12-02 and 2026-12-06): Figures 2, 4, 5(a) --
# Every arm of an experiment trains to its own plateau under one stopping rule and one cap: validation every
# 128 updates, stopped once the best of the last 10 validations is not 0.01 nats below the best before them,
# at most 24 epochs. A linear decay stretches over them and ends there (its rate reaches 0 at the cap: the end
# of its schedule, not a cap without a plateau); Pre-LN's step comes at epoch 8, the paper's, and no run stops
# before its step (2026-12-06).

CAP_EPOCHS = 24  # 6,144 updates of 256: 4.8x Figure 2's budget, 8x Figure 4's
STOP = dict(eval_every=128, patience=10, min_delta=0.01)
FIG2_CONVERGED_ARMS = ("post-warmup", "post-nowarmup", "pre-nowarmup")  # the short warmup does not fit the plan
BERT_CAP = 4000  # updates, 4x Figure 5(a)'s budget
BERT_STOP = dict(eval_every=50, patience=10, min_delta=0.01)
STEP_EPOCH = 8  # Pre-LN's x0.1 (Section 4: "decayed by 0.1 at epoch 8" of IWSLT14), update 2,048 of the cap


def plateau_protocol(name, protocol, arms=None, results_dir=RESULTS):
    """`protocol(small)` of the converged experiment on the CPU of the published protocol `name`: its runs at
    the chosen rates (`at_chosen_rates`; only `arms` where given), seed 1 of every arm first, each trained to
    its plateau (`STOP`, `BERT_STOP`) within the cap (`CAP_EPOCHS`, `BERT_CAP`). With `small` (--smoke), its
    first run (BERT: each recipe's seed 1)."""
    def made(small=False, base=None):
        runs = [run for run in at_chosen_rates(name, protocol, results_dir) if not arms or run.recipe in arms]
        # seed 1 of every arm first; within a seed, the schedules that do not depend on the cap before the
        # linear decays, which stretch over all of it (the order changes no run's numbers)
        runs = sorted(runs, key=lambda run: (run.spec.seed, getattr(run.spec, "schedule", "") == "linear"))
        if small:  # --smoke: the first run; for BERT, both recipes' seed 1 (its page reads the pair)
            runs = [run for run in runs if run.spec.seed == 1] if isinstance(runs[0].spec, BertSpec) else runs[:1]
        return Protocol(tuple(dataclasses.replace(run, spec=capped(run.spec)) for run in runs), None)
    return made


def capped(spec):
    """`spec` trained to its plateau within the cap of results/protocols.md, 2026-12-02; a step decay at
    STEP_EPOCH (2026-12-06)."""
    if isinstance(spec, BertSpec):
        return spec.but(steps=BERT_CAP, **BERT_STOP)
    return spec.but(epochs=CAP_EPOCHS, **STOP, **({"decay_epoch": STEP_EPOCH} if spec.schedule == "step" else {}))


def ends_at_the_cap(spec):
    """Whether `spec`'s rate decays linearly to 0 at its last update (BERT's recipes; Figure 4's linear arms):
    reaching the cap, such a run has ended its schedule (results/protocols.md, 2026-12-06)."""
    return isinstance(spec, BertSpec) or spec.schedule == "linear"


# --- the experiments of reproduce.py ---------------------------------------------------------------

@dataclass(frozen=True)
class Experiment:
    """One experiment of the Results table, as data.

    job           "translation", "bert", "finetune" or "analysis": which worker runs `runs`
    rows          the row functions of reproduction/tables.py that judge it (the rules are their constants)
    folder        what it writes: results/FOLDER/ (default its name); `figures`: the plots it draws there
    minutes       a first guess of its time on 2 cores, for a plan made before any run of it recorded one
    needs         experiments whose runs it reads (MRPC fine-tunes Figure 5(a)'s checkpoints)
    backend       the Keras backend its results were measured on (each draws its own random numbers)
    threads       the kernel threads each run had then (a run's numbers depend on the order of its sums)
    follow        for a protocol in stages: `follow(results, premises)` -> the later runs that the ended
                  runs' results ({name: results.json}) call for; premises=False (--smoke): every stage
    final         `final(results)` -> the runs whose final checkpoints stand for it (MRPC fine-tunes them),
                  or None while not known; by default all its runs
    longer_than   (folder, factor): its runs are those of results/FOLDER at `factor` times the updates
    hardware      "gpu": sized for GPUs (the converged protocol), run only when named (--only)
    copies        the files of its one run that results/FOLDER/ publishes as they are (the main command's)
    quick         one of the quick rows that `--plan` points to first (minutes, not hours)
    each          each run is published into results/FOLDER as it ends, so a stopped campaign loses only the
                  runs under way (the converged protocol's long runs)
    """

    name: str
    title: str
    job: str
    runs: tuple
    rows: tuple
    figures: tuple = ()
    minutes: float = 10.0
    needs: tuple = ()
    folder: str = ""
    backend: str = "jax"
    threads: int = 1
    follow: object = None
    final: object = None
    protocol: object = None
    longer_than: tuple = ()
    hardware: str = "cpu"
    copies: tuple = ()
    quick: bool = False
    each: bool = False

    def __post_init__(self):
        if not self.folder:
            object.__setattr__(self, "folder", self.name)

    def all_runs(self, results, premises=True):
        """Its runs known so far: the first stage's, and those `follow` adds for the `results` of ended runs."""
        more = self.follow(results, premises) if self.follow else ()
        return self.runs + tuple(run for run in more if run.name not in {r.name for r in self.runs})

    def assumed_runs(self):
        """Its runs when every premise holds and no grid widens (for the plan): its stages followed with
        made-up results in which every run trains and each arm's lowest validation loss is at the middle rate
        of its grid."""
        results = {}
        while True:
            runs = self.all_runs(results)
            fresh = [run for run in runs if run.name not in results]
            if not fresh:
                return runs
            for run in fresh:
                rates = sorted({other.spec.lr for other in runs if other.recipe == run.recipe})
                middle = rates[(len(rates) - 1) // 2]
                results[run.name] = dict(outcome="finished", test_tokenized_bleu=100.0,
                                         final_valid_loss=3.0 + abs(math.log(run.spec.lr / middle)))

    def final_runs(self, results):
        return self.final(results) if self.final else tuple(run.name for run in self.runs)

    def smoke(self):
        """The same experiment at the tiny size (`shrink`): its whole pipeline in seconds, every stage of its
        protocol whatever the tiny runs give, each arm with one rate and two seeds."""
        small = self.protocol(small=True) if self.protocol else Protocol(self.runs, self.follow, self.final)
        follow = small.follow and (lambda results, premises=True: tuple(
            dataclasses.replace(r, spec=shrink(r.spec)) for r in small.follow(results, False)))
        return dataclasses.replace(self, runs=tuple(dataclasses.replace(r, spec=shrink(r.spec)) for r in small.runs), minutes=0.5,
                                   follow=follow, final=small.final)


def shrink(spec):
    """`spec` at the tiny size, its run-defining settings kept: placement, optimizer, rate, schedule,
    warmup or not, deeper or shallower, seed. Translation runs train 8 updates on the synthetic corpus and
    decode 8 validation and 8 test sentences of at most 24 tokens (an untrained model decodes to the default
    200: a quarter of a tiny run's time)."""
    if isinstance(spec, TranslationSpec):
        layers = 1 if spec.encoder_layers <= 6 else 2
        return spec.but(preset="tiny", corpus="synthetic", lr=spec.lr, schedule=spec.schedule, d_model=None,
                        ffn_dim=None, heads=None, encoder_layers=layers, decoder_layers=layers, epochs=1,
                        max_updates=8, eval_every=4, valid_sentences=8, test_sentences=8, max_len_b=24,
                        warmup_steps=None if spec.warmup_steps >= 100 else 1)
    if isinstance(spec, BertSpec):
        return spec.but(preset="tiny", steps=8, warmup_steps=None if "warmup_steps" not in spec.given else 2,
                        **({"seeds": 1, "epochs": 1} if spec.finetune else {}))
    return spec.but(preset="tiny", random_tokens=True)


def _protocol(name, title, rows, figures, minutes, protocol, **more):
    """An experiment of results/protocols.md, from its `protocol(small)` (`Protocol`)."""
    made = protocol()
    return Experiment(name, title, more.pop("job", "translation"), made.runs, rows, figures, minutes,
                      follow=made.follow, final=made.final, protocol=protocol, **more)


EXPERIMENTS = {e.name: e for e in (
    Experiment("main", "the README's main command: Pre-LN without warmup (Sec 4)", "translation",
               (Run("main", TranslationSpec.build(norm="pre", no_warmup=True)),), ("as_well_row",), ("curves.png",),
               4.0, threads=2, copies=(rundir.CONFIG, rundir.METRICS, rundir.RESULTS, "curves.png"),
               quick=True),
    _protocol("fig2", "Figure 2: Post-LN with and without warmup, Adam (3 seeds) and SGD (rate grid, premise)",
              ("fig2_rows",), ("curves-fig2.png", "grid-fig2.png"), 252.0, fig2_protocol),
    _protocol("fig4", "Figure 4: five arms, each at its rate of 3 and 3 seeds; RAdam", ("as_well_row", "fig4_protocol_rows"),
              ("curves-fig4.png", "grid-fig4.png"), 225.0, fig4_protocol),
    _protocol("fig4-long", "Figure 4 at twice its budget: the five arms at Figure 4's chosen rates, 6 epochs, 3 seeds",
              (), ("curves-fig4-long.png",), 270.0, fig4_long_protocol,
              longer_than=("fig4", FIG4_LONG_EPOCHS / fig4_arms()[0].spec.epochs)),
    _protocol("fig4-converged", f"Figure 4's five arms at their chosen rates, 3 seeds, each trained to its plateau "
              f"(at most {CAP_EPOCHS} epochs)", ("as_well_row", "fig4_protocol_rows"), ("curves-fig4-converged.png",),
              270.0 * CAP_EPOCHS / 6, plateau_protocol("fig4", fig4_protocol), each=True,
              longer_than=("fig4", CAP_EPOCHS / fig4_arms()[0].spec.epochs)),
    _protocol("fig2-converged", f"Figure 2's Adam arms at 5e-4 and 1e-3, 3 seeds, each trained to its plateau "
              f"(at most {CAP_EPOCHS} epochs)", ("fig2_rows",), ("curves-fig2-converged.png",),
              252.0 * CAP_EPOCHS / 5, plateau_protocol("fig2", fig2_protocol, FIG2_CONVERGED_ARMS), each=True,
              longer_than=("fig2", CAP_EPOCHS / 5)),
    _protocol("depth-converged", f"DeepNet's arms at their chosen rates, each trained to its plateau (at most "
              f"{CONVERGED_TIMES}x the epochs)", (), (), 60.0 * CONVERGED_TIMES,
              converged_protocol("depth", depth_protocol), hardware="gpu", longer_than=("depth", CONVERGED_TIMES)),
    _protocol("depth", "DeepNet: Post-LN, Pre-LN, DeepNorm at 6 and 12 layers, rate grid, 3 seeds", ("depth_row",),
              ("curves-depth.png", "grid-depth.png", "depth.png"), 540.0, depth_protocol),
    _protocol("fig5", "Figure 5(a): BERT Post-LN with warmup against Pre-LN without, each at its rate of 4",
              ("fig5_rows",), ("curves.png", "grid.png"), 112.0, fig5_protocol, job="bert", backend="torch"),
    _protocol("fig5-converged", f"Figure 5(a)'s two recipes at their chosen rates, 3 seeds, each trained to its "
              f"plateau (at most {BERT_CAP} updates)", ("fig5_rows",), ("curves.png",),
              112.0 * BERT_CAP / 1000, plateau_protocol("fig5", fig5_protocol), job="bert", backend="torch",
              each=True, longer_than=("fig5", BERT_CAP / 1000)),
    Experiment("mrpc", "Figure 5(b, c): MRPC fine-tuning of Figure 5(a)'s final checkpoints", "finetune",
               (Run("finetune-mrpc", BertSpec.build(finetune="mrpc", seeds=3, epochs=1)),), ("fig5_rows",),
               ("finetune-mrpc.png",), 15.0, needs=("fig5",), folder="fig5", backend="torch"),
    Experiment("analysis", "Sections 3.3-3.4 and DeepNet: gradients and norms at initialization", "analysis",
               (Run("analysis", AnalysisSpec.build()),), ("analysis_rows",),
               ("fig3-layers.png", "fig3-depth.png", "lemma2.png", "after-warmup.png", "deepnet-update.png"), 2.5,
               threads=2, quick=True),
)}
