"""The Results table's experiments as data: for each, its runs (specs, with a seeds axis), the rows of
the table it fills and the rules that judge them, its results/ folder and its figures. Without Keras.

    EXPERIMENTS["fig2"].runs                       # (Run(name, spec), ...): exactly what the row measured
    EXPERIMENTS["fig2"].smoke().runs                # the same pipeline at the tiny size (reproduce.py --smoke)
    sweep_runs("fig2", TranslationSpec.build(preset="iwslt"))   # train_nmt.py --sweep fig2 --preset iwslt
    sweep_runs("depth", base, depths=(6, 12, 24))               # --depths overrides the experiment's own

A sweep is a list of specs: each run is the command line's spec with the sweep's settings under it and the
flags that define the run on top (`TranslationSpec.but`), so `--sweep NAME` with no other flag runs what its
row was measured with, and any flag the user gives (`--epochs 1`) applies to every run but those it would
blur (a run's own `--norm`, `--lr`, ...). `reproduce.py` runs the experiments and writes results/ directly;
the rules are the row functions of results/tables.py named in `rows`, which judge the files written there.
"""

from dataclasses import dataclass, field

from harness.specs import AnalysisSpec, BertSpec, TranslationSpec


@dataclass(frozen=True)
class Run:
    """One run of an experiment: its name (its run directory, and its files' names in results/) and spec."""

    name: str
    spec: object


def rate(value):
    """A learning rate as run names write it: 1e-3, 5e-4, 1.5e-3."""
    mantissa, exponent = f"{value:.6e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def seeded(runs, seeds):
    """The seeds axis: each run once per seed; seed 1 keeps the run's name, seed n adds "-seedn"."""
    return tuple(Run(run.name if seed == 1 else f"{run.name}-seed{seed}", run.spec.but(seed=seed))
                 for seed in seeds for run in runs)


# --- train_nmt.py --sweep ---------------------------------------------------------------------------

SWEEPS = ("fig2", "fig4", "depth")

SWEEP_SETTINGS = {
    # The settings each row of the Results table was measured with (results/fig2/grid.csv, results/depth):
    # short_warmup: Figure 2's 500 of 4,000 warmup updates, scaled to the preset's warmup (300 / 8 = 38).
    # fig2: 6 + 6 layers and 5 epochs, since Post-LN with warmup reached 10.4 test BLEU in 3 and 25.1 in 5
    # (a baseline that trains). depth: the preset's width (d 128), 6 and 12 layers per stack, 2 epochs,
    # two seeds, greedy test BLEU, 200 warmup updates to a constant 1e-3 for every placement.
    "cpu": dict(lr=1e-3, warmup=300, fig2_lrs=[1e-3], fig2_schedule="constant", short_warmup=38,
                fig2_sgd_lrs=[5e-3, 1e-3], fig2=dict(encoder_layers=6, decoder_layers=6, epochs=5), fig4={},
                depths=(6, 12), depth_seeds=(1, 2),
                depth=dict(schedule="constant", lr=1e-3, warmup_steps=200, epochs=2, eval_every=120,
                           valid_sentences=200, beam=1)),
    # The paper (Section 3.2): Adam at lr_max 5e-4 and 1e-3 with warmup 4000, 500 and 1 (none), SGD at 5e-3
    # and 1e-3 with warmup 4000 and none, inverse sqrt after the warmup in every run; DeepNet's depths.
    "iwslt": dict(lr=5e-4, warmup=4000, fig2_lrs=[5e-4, 1e-3], fig2_schedule="inverse_sqrt", control_lr=5e-4,
                  short_warmup=500, fig2_sgd_lrs=[5e-3, 1e-3], fig2={}, fig4={}, depths=(6, 12, 24, 48),
                  depth_seeds=(1,), depth=dict(schedule="inverse_sqrt", lr=5e-4)),
    # WMT14 (Section 4, Figure 4(c, d)): Pre-LN without warmup at lr 7e-4 and 1.5e-3, held until epoch 6
    # then inverse sqrt, against Post-LN with warmup 4000 at the same lr_max; RAdam was tried on IWSLT14
    # only. fig2 is Figure 2's design (Section 3.2, IWSLT14 in the paper) at the WMT14 rates.
    "wmt14": dict(lr=7e-4, warmup=4000, fig2_lrs=[7e-4, 1.5e-3], fig2_schedule="inverse_sqrt", control_lr=7e-4,
                  short_warmup=500, fig2_sgd_lrs=[5e-3, 1e-3], fig4_lrs=[7e-4, 1.5e-3],
                  fig4_pre_schedule="decay_then_inverse_sqrt", fig4_radam=False, fig2={}, fig4={},
                  depths=(6, 12, 24, 48), depth_seeds=(1,), depth=dict(schedule="inverse_sqrt", lr=7e-4)),
    # For tests: every run's pipeline in seconds.
    "tiny": dict(lr=5e-4, warmup=2, fig2_lrs=[5e-4], fig2_schedule="inverse_sqrt", control_lr=5e-4, short_warmup=1,
                 fig2_sgd_lrs=[5e-3], fig2={}, fig4={}, depths=(1, 2), depth_seeds=(1,),
                 depth=dict(schedule="constant", warmup_steps=2)),
}


def sweep_runs(name, base, depths=None):
    """The runs of train_nmt.py's sweep `name` ("fig2", "fig4" or "depth") for the command line's spec
    `base` (its preset picks `SWEEP_SETTINGS`; the flags it was given apply to every run).

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
    depth  DeepNet (Figure 1, Table 1): Post-LN, Pre-LN and DeepNorm at each depth of `depths` (encoder =
           decoder layers), one learning rate and schedule for all, once per seed of `depth_seeds`.
    """
    s = SWEEP_SETTINGS[base.preset]
    user = {k: v for k, v in base.flags().items() if k not in ("out", "resume")}

    def run(run_name, defaults, **own):
        return Run(run_name, TranslationSpec.build(**{**defaults, **user, **own}))

    if name == "fig2":
        defaults, schedule = dict(warmup_steps=s["warmup"], **s["fig2"]), s["fig2_schedule"]
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
    if name == "fig4":
        defaults, pre = dict(warmup_steps=s["warmup"], **s["fig4"]), s.get("fig4_pre_schedule", "step")
        runs = [r for lr in s.get("fig4_lrs", [s["lr"]]) for r in (
            run(f"post-warmup-lr{rate(lr)}", defaults, norm="post", lr=lr, schedule="inverse_sqrt"),
            run(f"pre-nowarmup-lr{rate(lr)}", defaults, norm="pre", lr=lr, schedule=pre, no_warmup=True))]
        if s.get("fig4_radam", True):
            runs += [run(f"{norm}-radam-nowarmup", defaults, norm=norm, lr=s["lr"], optimizer="radam",
                         schedule="linear", no_warmup=True) for norm in ("post", "pre")]
        return tuple(runs)
    if name == "depth":
        runs = [run(f"{norm}-{depth}L", s["depth"], norm=norm, encoder_layers=depth, decoder_layers=depth)
                for depth in (depths or s["depths"]) for norm in ("post", "pre", "deepnorm")]
        return seeded(runs, (base.seed,) if "seed" in base.given else s["depth_seeds"])
    raise ValueError(f"no sweep {name!r}; choose from {', '.join(SWEEPS)}")


# --- pretrain_bert.py --sweep fig5 ------------------------------------------------------------------

BERT_SWEEPS = ("fig5",)
# Figure 5(a) as measured: 1,000 updates at the cpu preset, Post-LN's warmup 100 (10 %).
FIG5_SETTINGS = {"cpu": dict(steps=1000, warmup_steps=100), "base": {}, "tiny": {}}


def bert_sweep_runs(name, base):
    """pretrain_bert.py's sweep: Figure 5(a)'s two recipes for the command line's spec `base`."""
    if name != "fig5":
        raise ValueError(f"no sweep {name!r}; choose from {', '.join(BERT_SWEEPS)}")
    user = {k: v for k, v in base.flags().items() if k not in ("out", "resume", "recipe", "norm", "lr", "no_warmup",
                                                               "vocab")}
    defaults = FIG5_SETTINGS[base.preset]
    return (Run("post-warmup", BertSpec.build(**{**defaults, **user, "recipe": "post-warmup"})),
            Run("pre-no-warmup", BertSpec.build(**{**defaults, **user, "recipe": "pre-no-warmup", "no_warmup": True})))


# --- the experiments of reproduce.py ---------------------------------------------------------------

@dataclass(frozen=True)
class Experiment:
    """One experiment of the Results table, as data.

    job           "translation", "bert", "finetune" or "analysis": which worker runs `runs`
    rows          the row functions of results/tables.py that judge it (the rules are their constants)
    folder        what it writes: results/FOLDER/ (default its name); `figures`: the plots it draws there
    minutes       a first guess of its time on 2 cores, for a plan made before any run of it recorded one
    needs         experiments whose runs it reads (MRPC fine-tunes Figure 5(a)'s checkpoints)
    backend       the Keras backend its results were measured on: each draws its own random numbers, so
                  a re-measurement uses the same one
    threads       the kernel threads each run had then: a run's numbers depend on it (the order of its
                  sums), so reproduce.py gives each run as many, whatever the machine or --jobs
    shared_cores  how many runs shared the 2 cores when the times its result files record were measured
                  (the results pages say): the plan scales those times to 2 runs at a time until a
                  reproduction has recorded its own (timing.json)
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
    shared_cores: int = 2
    backend: str = "jax"
    threads: int = 1

    def __post_init__(self):
        if not self.folder:
            object.__setattr__(self, "folder", self.name)

    def smoke(self):
        """The same experiment, every run at the tiny size (`shrink`): its whole pipeline in seconds."""
        return Experiment(self.name, self.title, self.job, tuple(Run(r.name, shrink(r.spec)) for r in self.runs),
                          self.rows, self.figures, 0.5, self.needs, self.folder, 2, self.backend, self.threads)


def shrink(spec):
    """`spec` at the tiny size, its run-defining settings kept: placement, optimizer, rate, schedule,
    warmup or not, deeper or shallower, seed. Translation runs train 8 updates on the synthetic corpus and
    decode 40 test sentences."""
    if isinstance(spec, TranslationSpec):
        layers = 1 if spec.encoder_layers <= 6 else 2
        return spec.but(preset="tiny", corpus="synthetic", lr=spec.lr, schedule=spec.schedule, d_model=None,
                        ffn_dim=None, heads=None, encoder_layers=layers, decoder_layers=layers, epochs=1,
                        max_updates=8, eval_every=4, valid_sentences=None, test_sentences=40,
                        warmup_steps=None if spec.warmup_steps >= 100 else 1)
    if isinstance(spec, BertSpec):
        return spec.but(preset="tiny", steps=8, warmup_steps=None if "warmup_steps" not in spec.given else 2,
                        **({"seeds": 1, "epochs": 1} if spec.finetune else {}))
    return spec.but(preset="tiny", random_tokens=True)


def _main_and_sweep(name, title, rows, figures, minutes, sweep=None, shared_cores=2, threads=1):
    runs = sweep_runs(sweep, TranslationSpec.build()) if sweep else (
        Run("main", TranslationSpec.build(norm="pre", no_warmup=True)),)
    return Experiment(name, title, "translation", runs, rows, figures, minutes, shared_cores=shared_cores,
                      threads=threads)


EXPERIMENTS = {e.name: e for e in (
    _main_and_sweep("main", "the README's main command: Pre-LN without warmup (Sec 4)", ("main_row",),
                    ("curves.png",), 4.0, shared_cores=1, threads=2),
    _main_and_sweep("fig2", "Figure 2: Post-LN with and without warmup, Adam and SGD", ("fig2_rows",),
                    ("curves-fig2.png",), 100.0, sweep="fig2"),
    _main_and_sweep("fig4", "Figure 4: Pre-LN without warmup against Post-LN with warmup; RAdam", ("fig4_rows",),
                    ("curves-fig4.png",), 25.0, sweep="fig4"),
    _main_and_sweep("depth", "DeepNet: Post-LN, Pre-LN and DeepNorm at 6 and 12 layers, 2 seeds", ("depth_row",),
                    ("curves-depth.png", "depth.png"), 240.0, sweep="depth", shared_cores=6),
    Experiment("fig5", "Figure 5(a): BERT Post-LN with warmup against Pre-LN without", "bert",
               bert_sweep_runs("fig5", BertSpec.build()), ("fig5_rows",), ("curves.png",), 75.0, shared_cores=6,
               backend="torch"),
    Experiment("mrpc", "Figure 5(b, c): MRPC fine-tuning of Figure 5(a)'s final checkpoints", "finetune",
               (Run("finetune-mrpc", BertSpec.build(finetune="mrpc", seeds=3, epochs=1)),), ("fig5_rows",),
               ("finetune-mrpc.png",), 15.0, needs=("fig5",), folder="fig5", backend="torch"),
    Experiment("analysis", "Sections 3.3-3.4 and DeepNet: gradients and norms at initialization", "analysis",
               (Run("analysis", AnalysisSpec.build()),), ("analysis_rows",),
               ("fig3-layers.png", "fig3-depth.png", "lemma2.png", "after-warmup.png", "deepnet-update.png"), 2.5,
               shared_cores=1, threads=2),
)}
