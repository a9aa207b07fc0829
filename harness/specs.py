"""A run's settings as one frozen dataclass per job, built once from the command line (or from an
experiment's list of runs) and never changed after: `TranslationSpec` (train_nmt.py), `BertSpec`
(pretrain_bert.py) and `AnalysisSpec` (analyze_grads.py). Without Keras.

    spec = TranslationSpec.build(norm="pre", no_warmup=True)     # presets resolved, schedule decided
    spec.schedule, spec.decay_factor                              # 'step', 0.1: decided here, once
    spec.given                                                    # {'norm', 'no_warmup'}: what was asked
    spec.but(encoder_layers=12, seed=2)                           # a new spec, rebuilt from given + changes
    spec.flags()                                                  # {'norm': 'pre', 'no_warmup': True}

`build(**given)` takes the values a user (or an experiment) gave, keyed by field; every other field takes
the preset's value, then the dataclass default. Values derived from others (the schedule without
warmup, the drop at --decay-epoch, BERT's recipe) are decided in `build` and nowhere else. `but` is
`dataclasses.replace` that re-derives them: replace alone would keep, say, the warmup schedule of a spec
turned into a no-warmup one. `flags()` gives back what was asked, which is what a child process, a
sweep's run or config.json needs to rebuild the same spec.

A field that is a flag is declared once, here, with its default and its flag's help, choices and aliases
(`setting`, below); each script's parser is made from its spec's fields (`cli.spec_parser`).

Each preset's values, with their sources, are below the spec that uses them. The jobs (harness/nmt_job.py,
harness/bert_job.py, harness/grads_job.py) take a spec; the run directory records it (`spec.config()`,
harness/rundir.py).
"""

import argparse
import dataclasses
import functools
import math
from dataclasses import dataclass, field

from harness.console import UsageError
from harness.files import parallel_splits


# --- the names and defaults the command lines and the library share (the scripts read them for their
# flags' choices and help before any backend is loaded; the data, decoding and device modules read the same
# objects, so a new schedule is added here once, a new placement here and in layers.py) ---

# The papers' comparisons as one command (`--sweep NAME`; their runs: reproduction/experiments.py, which a
# training run does not import).
SWEEPS = ("fig2", "fig4", "depth")  # train_nmt.py
BERT_SWEEPS = ("fig5",)  # pretrain_bert.py
# The three LayerNorm placements (layers.ResidualNorm) and their names in plots and tables. layers.py defines an
# identical NORMS of its own, so that its classes paste without the project; tests/test_layers.py checks the two.

NORMS = ("post", "pre", "deepnorm")
NORM_NAMES = {"post": "Post-LN", "pre": "Pre-LN", "deepnorm": "DeepNorm"}
# train_nmt.py --qkv-init: the gain on W^Q, W^K, W^V's Xavier init (models.TranslationTransformer's qkv_gain):
# "toolkit" is fairseq's and torchscale's 1/sqrt(2) (layers.TOOLKIT_QKV_GAIN), "theory" the papers' gain 1.
QKV_INITS = {"toolkit": 2 ** -0.5, "theory": 1.0}

# The longest sentence pair training keeps, in tokens (nmt_data.encode_pairs; the last decoding bucket).
LONGEST_PAIR = 256
# The longest output: the model's sinusoidal positions have no limit, but training sees decoder positions
# 0 .. LONGEST_PAIR - 1, so at most 255 tokens and EOS (fairseq caps max_len at max_decoder_positions() - 1).
MAX_LEN = LONGEST_PAIR - 1
# The token ids every vocabulary starts with (harness/nmt_data.py), and the BPE continuation marker of fairseq's
# BPE-split text (IWSLT14, WMT14).
PAD, EOS, UNK = 0, 1, 2
BPE_MARKER = "@@ "
# Padded source lengths of decoding batches (decoding.translate): two programs each (the encoder pass and
# the beam step), so coarser than training's (nmt_data.BUCKETS), doubling. The padding does not change a
# translation: the 1,000 test translations of the main command's model are the same with BUCKETS.
DECODING_BUCKETS = (16, 32, 64, 128, LONGEST_PAIR)

# Decoding settings and their defaults: the beam and length penalty of the paper's setup (Section 3.2,
# fairseq's IWSLT14 recipe), the length rules and <unk> penalty of fairseq-generate.
DECODING = dict(beam=5, lenpen=1.2, max_len_a=0.0, max_len_b=200, min_len=1, unkpen=0.0)

# --corpus, --dictionaries and --batching (harness/nmt_data.py): the built-in corpora, one joint vocabulary or
# one a side, and how sentence pairs are put into batches.
CORPORA = ("multi30k", "ding", "synthetic")
DICTIONARIES = ("joint", "separate")
BATCHINGS = ("packed", "grid")
# pretrain_bert.py --finetune: the GLUE tasks harness/bert_data.py reads (its GLUE_TASKS, one entry each).
GLUE_TASK_NAMES = ("mrpc", "rte")

# --wmt14-valid: the validation set harness/wmt14.py prepares, the paper's newstest2013 or the script's split.
WMT14_VALID = ("newstest2013", "split")

# --optimizer and --schedule (optimizers.make_optimizer and schedules.make_schedule build them).
OPTIMIZERS = ("adam", "sgd", "radam")
SCHEDULES = ("inverse_sqrt", "step", "decay_then_inverse_sqrt", "linear", "constant")

# --distribute, --precision and --peer-timeout (harness/devices.py, harness/files.py).
MODES = ("auto", "none", "data", "model")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
PEER_TIMEOUT_S = 60

# The largest sizes a command line may ask for, so that a batch (and a beam search's hypotheses) is refused
# before its arrays are allocated, not by the machine running out of memory: 8 x the paper's WMT14 global
# batch of 131,072 tokens; BERT's sequences and --benchmark's sentences per batch (256 x BERT-base's 256);
# 50 x the paper's beam of 5.
MAX_TOKENS = 2 ** 20
MAX_SEQUENCES = 2 ** 16
MAX_BEAM = 256
AT_MOST_WHY = "a bound that keeps a batch and its arrays within memory, harness/specs.py"


def int_list(text):
    """An argparse type: "6,12,24" -> [6, 12, 24], positive integers."""
    values = [v.strip() for v in text.split(",") if v.strip()]
    if not values or not all(v.isdigit() and int(v) >= 1 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers, e.g. 6,12,24")
    return [int(v) for v in values]


def comma_names(text):
    """An argparse type: "post, pre" -> ("post", "pre"), empty names left out (the script checks the rest)."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def setting(default=dataclasses.MISSING, *, help, group=None, concern=None, aliases=(), positional=False,
            **options):
    """A field of a spec (harness/specs.py) that is also a flag of its script, declared once: its default
    (none: the preset's value, or one `build` decides), its `help`, the `group` of --help that lists it (a
    key of the spec's GROUPS; None: the script's own options), the `concern` whose part of the spec holds
    it (default: its group; `specs.Part`) and argparse's `options` (choices, metavar, nargs, type, action).
    The flag is `flag_name(field)`, then its `aliases` (fairseq's --max-update beside --max-updates); a
    `positional` setting is an argument without a flag (analyze_grads.py's analysis)."""
    return dataclasses.field(default=default, metadata=dict(help=help, group=group, concern=concern or group,
                                                            aliases=aliases, positional=positional, options=options))


def _warmup(settings):
    """The warmup updates a run's schedule has (translation and BERT): none with --no-warmup, else
    --warmup-updates."""
    return 0 if settings.no_warmup else settings.warmup_steps


class Part:
    """One concern's settings of a spec (`_Spec.part`), frozen: the fields whose setting names that concern,
    and `given`, those of them that were given. A function that needs one concern takes its part."""

    warmup = property(_warmup)

    def but(self, **changes):
        """A new part: this one with `changes`, which count as given (those not None, as `_Spec.build` counts
        them)."""
        return dataclasses.replace(self, **changes, given=self.given | {k for k, v in changes.items() if v is not None})


@functools.cache
def _part_class(spec_class, concern):
    """The frozen dataclass of `concern`'s part of `spec_class`: its settings' fields, then `given`."""
    names = [(f.name, f.type) for f in dataclasses.fields(spec_class) if f.metadata.get("concern") == concern]
    if not names:
        raise ValueError(f"{spec_class.__name__} has no setting of concern {concern!r}")
    return dataclasses.make_dataclass(f"{spec_class.__name__.removesuffix('Spec')}{concern.title()}",
                                      [*names, ("given", frozenset, field(default_factory=frozenset))],
                                      bases=(Part,), frozen=True, kw_only=True)


RENAMED = {"steps": "--total-updates", "warmup_steps": "--warmup-updates"}  # dests kept from older names


def flag_name(dest):
    """The flag of a field: `--d-model` for d_model, `--warmup-updates` for warmup_steps."""
    return RENAMED.get(dest, "--" + dest.replace("_", "-"))


def _numbers(value):
    """The floats of a setting's value (a float, or a tuple of them such as --adam-betas)."""
    return [v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, float)]


def _concern(name, doc):
    """A spec's property giving one concern's part (`_Spec.part`)."""
    return property(lambda self: self.part(name), doc=doc[0].upper() + doc[1:] + ".")


class _Spec:
    """What the three specs share: building from the given values, rebuilding, the given values, and the
    parts by concern."""

    PRESETS = {}
    GROUPS = {}  # the groups of --help, {title: description} in their order, that the fields' settings name

    @classmethod
    def build(cls, **given):
        names = {f.name for f in dataclasses.fields(cls)} - {"given"}
        unknown = sorted(set(given) - names)
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)}")
        given = {k: tuple(v) if isinstance(v, list) else v for k, v in given.items() if v is not None}
        preset = given.get("preset", cls.__dataclass_fields__["preset"].default)
        values = {**cls.PRESETS[preset], **given}
        values = cls._derive(values, given)
        return cls(**values, given=frozenset(given))

    @classmethod
    def _derive(cls, values, given):
        return values

    def but(self, **changes):
        """A new spec: this one's given values with `changes` on top, derived values decided again."""
        return type(self).build(**{**self.flags(), **changes})

    warmup = property(_warmup)

    def part(self, concern):
        """The settings of one `concern` (model, data, optimization, training, decoding, devices, ...: the
        `concern` of their `setting`, by default its group) as a frozen `Part`, `given` narrowed to them."""
        names = [f.name for f in dataclasses.fields(_part_class(type(self), concern)) if f.name != "given"]
        return _part_class(type(self), concern)(**{name: getattr(self, name) for name in names},
                                                given=self.given & set(names))

    model = _concern("model", "the model's settings: width, depth, heads, dropout, LayerNorm placement, initialisation")
    data = _concern("data", "the data's settings: corpus, languages, vocabulary, batches")
    optimization = _concern("optimization", "the optimizer's and learning-rate schedule's settings")
    training = _concern("training", "the training loop's settings: its length, seed, validation, logging, checkpoints")
    decoding = _concern("decoding", "beam search's settings (translation)")
    devices = _concern("devices", "the devices, distribution and precision (`devices.configure`)")

    # The ranges `check` holds settings to: at least 1 (unless unset), at least 0, in [0, 1); the sizes that
    # must fit in memory, {field: at most}; the float settings where inf means something.
    POSITIVE, NOT_NEGATIVE, FRACTIONS, AT_MOST, INFINITE = (), (), (), {}, ()
    # Settings that stop a run before the end its schedule spans: a --resume without them goes on to that end
    # (`cli.resumed_flags`); every other setting a --resume is not given is the run's own.
    PAUSES = ()

    def check(self):
        """Refuse, with one line (`UsageError`), a setting outside its range, then what `_check` adds for the
        job (settings that must agree with each other). The scripts call it before any work."""
        for name in self.POSITIVE:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UsageError(f"{flag_name(name)} must be a positive integer, got {getattr(self, name)}")
        for name in self.NOT_NEGATIVE:
            if getattr(self, name) < 0:
                raise UsageError(f"{flag_name(name)} must be >= 0, got {getattr(self, name)}")
        for name in self.FRACTIONS:
            if not 0 <= getattr(self, name) < 1:
                raise UsageError(f"{flag_name(name)} must be in [0, 1), got {getattr(self, name)}")
        for name in sorted(self.given - set(self.INFINITE)):  # inf is refused as nan is, where no bound means it
            if not all(math.isfinite(v) for v in _numbers(getattr(self, name))):
                raise UsageError(f"{flag_name(name)} must be a finite number, got {getattr(self, name)}")
        for name, limit in self.AT_MOST.items():
            if getattr(self, name) is not None and getattr(self, name) > limit:
                raise UsageError(f"{flag_name(name)} {getattr(self, name)} is above {limit:,}, the most this project "
                                 f"allows ({AT_MOST_WHY}); give at most {limit:,}")
        if not self.lr > 0:
            raise UsageError(f"--lr must be positive, got {self.lr}")
        if self.d_model % self.heads:
            raise UsageError(f"--d-model {self.d_model} must be divisible by --heads {self.heads}")
        self._check()  # each spec's own

    def flags(self):
        """The values that were given ({field: value}): enough to build this spec again."""
        return {name: getattr(self, name) for name in sorted(self.given)}

    def config(self):
        """Every field, for config.json (`given` as a sorted list), and `flags`, the given values: what
        --resume builds the run's spec again from (`cli.resumed_flags`)."""
        config = dataclasses.asdict(self)
        config["given"], config["flags"] = sorted(self.given), self.flags()
        return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


# --distribute, --model-parallel, --precision and --peer-timeout (harness/devices.py, harness/files.py): the
# same four flags of train_nmt.py and pretrain_bert.py, in one group of --help.
DEVICES = "devices and precision"
DEVICE_SETTINGS = dict(
    distribute=dict(default="auto", choices=MODES, help="auto: data parallel when there are several devices; model: "
                    "jax, shard attention and FFN kernels (default: %(default)s)"),
    model_parallel=dict(default=2, help="devices along the model axis with --distribute model (default: %(default)s)"),
    precision=dict(default="float32", choices=PRECISIONS, help="Keras dtype policy (default: %(default)s)"),
    peer_timeout=dict(default=PEER_TIMEOUT_S, help="several processes (docs/several-hosts.md): seconds to wait for "
                      "the others to join, or for one that stopped answering, before the run ends with a message "
                      "(exit code 3)"),
)


def device_setting(name):
    """A field for one of `DEVICE_SETTINGS`: a new one for each spec (dataclasses names a field in its class)."""
    return setting(group=DEVICES, concern="devices", **DEVICE_SETTINGS[name])


# --- checks of the decoding and devices parts (harness/nmt_job.py, harness/devices.py) ----------------

def check_decoding(decoding):
    """The length rules of `decoding.beam_search` (`decoding`: the spec's decoding part) must leave room for
    a translation."""
    if not 0 <= decoding.max_len_a < math.inf:
        raise UsageError(f"--max-len-a must be a number >= 0, got {decoding.max_len_a}")
    if not 0 <= decoding.min_len <= min(decoding.max_len_b, MAX_LEN):
        raise UsageError(f"--min-len {decoding.min_len} must be >= 0 and at most --max-len-b {decoding.max_len_b} "
                         f"(and {MAX_LEN})")
    if decoding.max_len_b < 1:
        raise UsageError(f"--max-len-b must be a positive number of tokens, got {decoding.max_len_b}")
    if math.isnan(decoding.unkpen) or decoding.unkpen == -math.inf:
        raise UsageError(f"--unkpen must be a number or inf, got {decoding.unkpen}")


def decoding_summary(decoding):
    return (f"max length {decoding.max_len_a:g} x source + {decoding.max_len_b}, min length {decoding.min_len}, "
            f"unkpen {decoding.unkpen:g}")


def length_rules(decoding):
    """The keyword arguments of `decoding.beam_search` (through `translate`) that --max-len-a, --max-len-b
    and --min-len set (`decoding`: the spec's decoding part)."""
    return dict(max_len_a=decoding.max_len_a, max_len_b=decoding.max_len_b, min_len=decoding.min_len)


def check_distribution_arguments(devices):
    """The settings of `devices` (the spec's devices part) must name a mode, a precision, and positive counts."""
    if devices.distribute not in MODES:
        raise UsageError(f"--distribute {devices.distribute}: unknown; choose from {', '.join(MODES)}")
    if devices.precision not in PRECISIONS:
        raise UsageError(f"--precision {devices.precision}: unknown; choose from {', '.join(PRECISIONS)}")
    if devices.model_parallel < 1:
        raise UsageError(f"--model-parallel must be a positive integer, got {devices.model_parallel}")
    if getattr(devices, "peer_timeout", PEER_TIMEOUT_S) < 1:
        raise UsageError(f"--peer-timeout must be a positive number of seconds, got {devices.peer_timeout}")


# --- translation (train_nmt.py) ---------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class TranslationSpec(_Spec):
    """One train_nmt.py job: a training run, or --eval-only, --translate or --benchmark with its settings.
    Each field given by `setting` is a flag (`--d-model` is `d_model`), with its help; train_nmt.py's
    parser is made from them (`cli.spec_parser`)."""

    GROUPS = {"data": None, "model": None, "training": None,
              "decoding": "for validation and test BLEU, --eval-only and --translate (which takes the run's own "
                          "settings from its config.json unless given)",
              "runs": None, DEVICES: None}

    # the model and its placement
    norm: str = setting("post", concern="model", choices=NORMS,
                        help="LayerNorm placement: post (default; --benchmark: pre), pre or deepnorm (the paper's "
                             "Table 1; DeepNet)")
    deepnorm_rule: str = setting("paper", concern="model", choices=("paper", "torchscale"),
                                 help="DeepNorm constants of an encoder-decoder: the paper's Table 1 (encoder "
                                      "beta 0.87 (N^4 M)^(-1/16)) or the authors' torchscale code (1.15 (N^4 "
                                      "M)^(-1/16)); default paper")
    qkv_init: str = setting("toolkit", concern="model", choices=tuple(QKV_INITS),
                            help="the Xavier gain on W^Q, W^K, W^V: toolkit (default; 1/sqrt(2), as fairseq and "
                                 "torchscale train) or theory (1, as the papers' analyses assume); W^O and the FFN "
                                 "keep gain 1, and DeepNorm's beta scales W^V, W^O, W^1, W^2 on top")
    preset: str = setting("cpu", help="the defaults of the flags marked [preset: ...]: cpu (default: minutes on 2 "
                          "cores), iwslt (the paper's IWSLT14), wmt14 (the paper's WMT14 En-De, en -> de) or tiny "
                          "(tests)")
    d_model: int = setting(group="model", help="model width d")
    ffn_dim: int = setting(group="model", help="FFN inner width")
    heads: int = setting(group="model", help="attention heads")
    encoder_layers: int = setting(group="model", help="encoder blocks N")
    decoder_layers: int = setting(group="model", help="decoder blocks M")
    dropout: float = setting(group="model", help="dropout on embeddings and on each sub-layer's output")
    attention_dropout: float = setting(group="model", help="dropout on the attention probabilities")
    activation_dropout: float = setting(group="model", help="dropout inside the FFN, after its ReLU")
    # data
    corpus: str = setting("multi30k", group="data", choices=CORPORA,
                          help="built-in corpus when no --data-dir: multi30k (default, real captions, data/multi30k), "
                               "ding (Debian's trans-de-en) or synthetic (a generated toy task, for fast tests)")
    data_dir: str | None = setting(None, group="data",
                                   help="fairseq layout {train,valid,test}.{src,tgt}; overrides --corpus")
    src: str = setting(group="data", help="source language")
    tgt: str = setting(group="data", help="target language")
    prepare_iwslt14: str | None = setting(None, group="data", metavar="ARCHIVE",
                                          help="raw IWSLT14 de-en.tgz -> --data-dir (prepare-iwslt14.sh)")
    prepare_wmt14: str | None = setting(None, group="data", metavar="ARCHIVE_DIR",
                                        help="directory of the WMT14 archives -> --data-dir (prepare-wmt14en2de.sh; "
                                             "harness/wmt14.py)")
    wmt14_valid: str = setting("newstest2013", group="data", choices=WMT14_VALID,
                               help="--prepare-wmt14's validation set: newstest2013 (default, the paper's) or split "
                                    "(the script's: every 100th training pair)")
    vocab_size: int = setting(group="data", help="joint BPE vocabulary (paper 10000)")
    dictionaries: str = setting(group="data", choices=DICTIONARIES,
                                help="joint: one vocabulary of both sides, one embedding for encoder, decoder and "
                                     "output; separate: a vocabulary per side, the decoder's embedding shared with the "
                                     "output (fairseq's IWSLT'14 recipe)")
    max_tokens: int = setting(group="data", help="tokens per batch: rows x padded length (paper 4096)")
    # None: packed for a new run; a resumed run keeps its own (nmt_job)
    batching: str | None = setting(None, group="data", choices=BATCHINGS,
                                   help="packed (default): several sentence pairs to a row, attention kept within "
                                        "each pair, one batch shape (one compiled step); grid: fairseq's batches, one "
                                        "pair a row, padded to a length grid (about 20 shapes). --resume keeps the "
                                        "run's own (grid for runs from before packing)")
    valid_sentences: int = setting(group="data", help="validation sentences decoded for BLEU each epoch (0 = all)")
    test_sentences: int = setting(0, group="data", metavar="N",
                                  help="decode only the first N test sentences for test BLEU: a quick check, not the "
                                       "paper's number (default 0: all; the tiny preset 100)")
    # training
    epochs: int = setting(group="training", aliases=("--max-epoch",), metavar="N",
                          help="passes over the training data")
    max_updates: int = setting(0, group="training", aliases=("--max-update",), metavar="N",
                               help="stop after this many updates (0 = no bound)")
    log_every: int = setting(50, group="training", metavar="UPDATES",
                             help="when the output is not a terminal, a progress line every UPDATES updates (0 = none; "
                                  "default 50)")
    eval_every: int = setting(group="training", metavar="UPDATES",
                              help="validate every UPDATES updates as well as at the end of each epoch (0 = only then)")
    backup_every: int = setting(0, group="training", metavar="UPDATES",
                                help="also back up the run (checkpoints/backup.keras) every UPDATES updates within an "
                                     "epoch, so that --resume continues mid-epoch (0 = only the epoch checkpoints; "
                                     "default)")
    # early stopping (`callbacks.Plateau`): validations without a better loss; 0 = off
    patience: int = setting(0, group="training", metavar="VALIDATIONS",
                            help="stop training once this many validations in a row have not lowered the best "
                                 "validation loss by --min-delta: trained to its plateau; with a step schedule, "
                                 "not before its step (0 = off; default)")
    min_delta: float = setting(0.01, group="training", metavar="NATS",
                               help="with --patience: the improvement in validation loss that counts (default 0.01)")
    optimizer: str = setting("adam", concern="optimization", group="training", choices=OPTIMIZERS,
                             help="adam (default; betas 0.9, 0.98, as the paper), sgd (plain, Figure 2) or radam "
                                  "(Figure 4)")
    lr: float = setting(group="training",
                        concern="optimization", help="peak learning rate (paper 5e-4 or 1e-3; cpu preset 1e-3)")
    # decided by `build` unless given: the paper's warmup + inverse sqrt, or the preset's recipe without warmup
    schedule: str = setting(group="training", concern="optimization", choices=SCHEDULES,
                            help="default: inverse_sqrt with warmup; with --no-warmup step (x0.1 after --decay-epoch; "
                                 "preset wmt14: decay_then_inverse_sqrt); decay_then_inverse_sqrt: constant until "
                                 "--decay-epoch, then x --decay-factor and inverse sqrt")
    nowarmup_schedule: str  # the preset's recipe without warmup (Section 4)
    warmup_steps: int = setting(group="training", concern="optimization", aliases=("--warmup-steps",), metavar="N",
                                help="linear warmup updates (paper 4000)")
    no_warmup: bool = setting(False, concern="optimization", group="training",
                              help="no warmup: the full rate from the first update; unless --schedule is given, this "
                                   "also switches the schedule to step decay (x0.1 after --decay-epoch; preset wmt14: "
                                   "decay_then_inverse_sqrt), Section 4's recipe; with --schedule inverse_sqrt, the "
                                   "paper's warmup = 1")
    decay_epoch: int = setting(concern="optimization", group="training",
                               help="epoch after which step/decay schedules decay (paper 8; WMT14 6)")
    # decided by `build` unless given: 0.1 for step (Section 4), 1 for decay_then_inverse_sqrt
    decay_factor: float = setting(concern="optimization", group="training",
                                  help="the drop at --decay-epoch: default 0.1 for step (Section 4), 1 for "
                                       "decay_then_inverse_sqrt (the 35.5-BLEU setting: inverse sqrt from update "
                                       "8000, no drop)")
    weight_decay: float = setting(group="training",
                                  concern="optimization", help="decoupled weight decay (iwslt: 1e-4, fairseq's recipe)")
    clip_norm: float = setting(0.0, group="training",
                               concern="optimization", help="clip the global gradient norm (0 = off)")
    label_smoothing: float = setting(0.1, group="training",
                                     help="label-smoothed cross entropy (paper and fairseq 0.1; default 0.1)")
    seed: int = setting(1, group="training", help="seed of the initialisation, dropout and batch order (default 1)")
    # decoding (validation and test BLEU, --eval-only, --translate)
    beam: int = setting(DECODING["beam"], group="decoding",
                        help="beam size for test BLEU (1 = greedy; default 5, or the run's own with --translate)")
    lenpen: float = setting(DECODING["lenpen"], group="decoding",
                            help="length penalty: score / length^lenpen (default 1.2, or the run's own with "
                                 "--translate)")
    max_len_a: float = setting(DECODING["max_len_a"], group="decoding", metavar="A",
                               help="at most A x source length + B tokens before EOS (fairseq-generate's --max-len-a; "
                                    "default 0)")
    max_len_b: int = setting(DECODING["max_len_b"], group="decoding", metavar="B",
                             help=f"see --max-len-a (fairseq-generate's --max-len-b; default 200; at most {MAX_LEN} "
                                  "tokens in any case)")
    min_len: int = setting(DECODING["min_len"], group="decoding",
                           help="at least this many tokens before EOS (fairseq-generate's --min-len; default 1: no "
                                "empty translation)")
    unkpen: float = setting(DECODING["unkpen"], group="decoding",
                            help="<unk> penalty: log p(<unk>) - UNKPEN (fairseq-generate's --unkpen; default 0; inf "
                                 "never generates <unk>)")
    eval_only: str | None = setting(None, concern="modes", group="decoding", metavar="RUN_OR_CHECKPOINT",
                                    help="only decode the test set with a run directory's newest checkpoint (or this "
                                         "checkpoint), on the data the run trained on (its config.json) unless data "
                                         "flags are given; writes RUN/eval.json")
    translate: str | None = setting(None, concern="modes", group="decoding", metavar="RUN_OR_CHECKPOINT",
                                    help="translate source lines from standard input (or --input) with a run "
                                         "directory's newest checkpoint, or a checkpoint of one: one output line per "
                                         "input line on standard output")
    input: str | None = setting(None, concern="modes", group="decoding", metavar="FILE",
                                help="--translate: read source lines from FILE, not standard input")
    # the run directory
    out: str | None = setting(None, group="runs", aliases=("--save-dir",), metavar="DIR",
                              help="run directory (default runs/NAME)")
    resume: bool = setting(False, group="runs", help="continue the run in --out from its last checkpoint")
    # --benchmark
    benchmark: int = setting(0, group="runs", metavar="STEPS",
                             help="time STEPS train steps of the plain-PyTorch reference's workload "
                                  "(bench/torch_reference.py) and print one JSON line")
    benchmark_sentences: int = setting(128, group="runs", metavar="N",
                                       help="sentences per benchmark batch (the reference's 128; more to fill a GPU)")
    peak_tflops: float | None = setting(None, group="runs", metavar="TFLOPS",
                                        help="--benchmark: the device's peak TFLOP/s for the step's matrix-product "
                                             "dtype, for MFU (model FLOP rate / peak); default: the table PEAK_TFLOPS "
                                             "(H100, H200), none on a CPU")
    # devices and precision
    distribute: str = device_setting("distribute")
    model_parallel: int = device_setting("model_parallel")
    precision: str = device_setting("precision")
    peer_timeout: int = device_setting("peer_timeout")
    given: frozenset = field(default_factory=frozenset)

    @classmethod
    def _derive(cls, values, given):
        # The benchmark's workload is the PyTorch reference's: Pre-LN unless --norm says otherwise.
        values.setdefault("norm", "pre" if values.get("benchmark") else "post")
        if "schedule" not in given:  # Section 3.2: warmup + inverse sqrt; Section 4: the preset's recipe without
            values["schedule"] = values["nowarmup_schedule"] if values.get("no_warmup") else "inverse_sqrt"
        if "decay_factor" not in given:
            values["decay_factor"] = 1.0 if values["schedule"] == "decay_then_inverse_sqrt" else 0.1
        return values

    def name(self):
        """The run's name, and its default directory under runs/."""
        warm = "nowarmup" if self.no_warmup else f"warmup{self.warmup_steps}"
        return f"{self.norm}-{self.optimizer}-{self.schedule}-{warm}-lr{self.lr:g}-{self.preset}"

    POSITIVE = ("d_model", "ffn_dim", "heads", "encoder_layers", "decoder_layers", "epochs", "max_tokens", "vocab_size",
                "beam", "decay_epoch")
    NOT_NEGATIVE = ("max_updates", "warmup_steps", "valid_sentences", "test_sentences", "eval_every", "log_every",
                    "backup_every", "patience", "min_delta")
    FRACTIONS = ("dropout", "attention_dropout", "activation_dropout", "label_smoothing")
    AT_MOST = {"max_tokens": MAX_TOKENS, "beam": MAX_BEAM, "benchmark_sentences": MAX_SEQUENCES}
    INFINITE = ("unkpen",)  # inf: never generate <unk>

    def _check(self):
        check_distribution_arguments(self.devices)
        if self.benchmark < 0:
            raise UsageError(f"--benchmark must be a positive number of steps, got {self.benchmark}")
        if self.benchmark_sentences < 1:
            raise UsageError(f"--benchmark-sentences must be a positive number, got {self.benchmark_sentences}")
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise UsageError(f"--peak-tflops must be a positive number of TFLOP/s, got {self.peak_tflops}")
        if self.weight_decay < 0 or self.clip_norm < 0 or self.decay_factor <= 0 or self.lenpen < 0:
            raise UsageError("--weight-decay, --clip-norm and --lenpen must be >= 0 and --decay-factor > 0")
        check_decoding(self.decoding)
        for flag in ("prepare_iwslt14", "prepare_wmt14"):
            if getattr(self, flag) and not self.data_dir:
                raise UsageError(f"{flag_name(flag)} needs --data-dir: the directory to write the prepared corpus to")
        if self.prepare_wmt14 and {self.src, self.tgt} != {"en", "de"}:
            raise UsageError(f"--prepare-wmt14 prepares English-German; --src {self.src} --tgt {self.tgt} do not "
                             "match it (use --src en --tgt de, the paper's direction, or --src de --tgt en)")
        if self.data_dir is not None and not (self.prepare_iwslt14 or self.prepare_wmt14):
            parallel_splits(self.data_dir, self.src, self.tgt)  # its paths and files: before the backend's import


TranslationSpec.PRESETS = {
    # Sized to finish in under 15 minutes on 2 CPU cores (jax) on Multi30k: 4 + 4 layers, d 128, 3 epochs
    # of 266 updates, lr 1e-3 (x0.1 after epoch 2 with --no-warmup); warmup 300 where used. docs/translation.md.
    "cpu": dict(d_model=128, ffn_dim=256, heads=4, encoder_layers=4, decoder_layers=4, dropout=0.1,
                attention_dropout=0.0, activation_dropout=0.0, max_tokens=2048, epochs=3, warmup_steps=300,
                decay_epoch=2, lr=1e-3, vocab_size=4000, valid_sentences=300, eval_every=200, weight_decay=0.0,
                dictionaries="joint", src="de", tgt="en", nowarmup_schedule="step"),
    # The paper's IWSLT14 model, each value with its source:
    #   d 512, FFN 1024, 4 heads, 6 + 6 layers, 4096-token batches, BPE 10K    paper, Appendix A
    #   warmup 4000, lr 5e-4 (Post-LN); decay after epoch 8 (Pre-LN)            paper, Sections 3.2 and 4
    #   dropout 0.3, weight decay 1e-4 (decoupled), no attention dropout        fairseq's IWSLT'14 recipe
    #       (examples/translation: transformer_iwslt_de_en, --dropout 0.3 --weight-decay 0.0001);
    #       Appendix A lists dropout 0.1 (pass --dropout 0.1 for that)
    #   separate source and target dictionaries, decoder input and output       fairseq's IWSLT'14 recipe
    #       embeddings shared (fairseq-preprocess without --joined-dictionary,
    #       --share-decoder-input-output-embed); the BPE merges are joint (paper)
    "iwslt": dict(d_model=512, ffn_dim=1024, heads=4, encoder_layers=6, decoder_layers=6, dropout=0.3,
                  attention_dropout=0.0, activation_dropout=0.0, max_tokens=4096, epochs=20, warmup_steps=4000,
                  decay_epoch=8, lr=5e-4, vocab_size=10000, valid_sentences=0, eval_every=0, weight_decay=1e-4,
                  dictionaries="separate", src="de", tgt="en", nowarmup_schedule="step"),
    # The paper's WMT14 En-De model (Section 4, Appendix A), each value with its source:
    #   d 512, FFN 2048, 8 heads, 6 + 6 layers, dropout 0.1   Transformer base: paper, Appendix A ("base
    #       setting"); Vaswani et al. 2017, Table 3; fairseq's transformer_wmt_en_de
    #   en -> de, joint BPE ~37K (harness/wmt14.py: 40000 merges)     paper, Appendix A; prepare-wmt14en2de.sh
    #       (the vocabulary cap only applies to raw text: BPE-split data keeps every token type)
    #   4096 tokens per batch                                 a choice for one GPU: the paper used 8192 tokens
    #       per GPU on 16 GPUs, 131,072 an update; --max-tokens is the global batch, so --max-tokens 131072
    #       with --distribute data over devices whose memory holds it reaches that
    #   lr 7e-4 (or 1.5e-3), warmup 4000 (Post-LN)             paper, Section 4 (lr_max as Pre-LN's)
    #   without warmup: constant, then inverse sqrt from       paper, Section 4: "decayed at the 6th epoch,
    #       epoch 6 (decay_then_inverse_sqrt, factor 1)           then inverse sqrt" (no drop stated)
    #   20 epochs                                             a choice: the paper does not state the length
    #       of its WMT14 runs; Figure 4(c, d) plots them by epoch
    #   no weight decay, no attention or activation dropout   fairseq's transformer_wmt_en_de defaults
    #   one joint dictionary, all embeddings shared           fairseq's WMT recipe (--joined-dictionary,
    #                                                             --share-all-embeddings)
    "wmt14": dict(d_model=512, ffn_dim=2048, heads=8, encoder_layers=6, decoder_layers=6, dropout=0.1,
                  attention_dropout=0.0, activation_dropout=0.0, max_tokens=4096, epochs=20, warmup_steps=4000,
                  decay_epoch=6, lr=7e-4, vocab_size=37000, valid_sentences=0, eval_every=0, weight_decay=0.0,
                  dictionaries="joint", src="en", tgt="de", nowarmup_schedule="decay_then_inverse_sqrt"),
    # For tests and a first look: seconds of training, and a test slice of 100 sentences to decode.
    "tiny": dict(d_model=32, ffn_dim=64, heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0,
                 attention_dropout=0.0, activation_dropout=0.0, max_tokens=256, epochs=1, warmup_steps=2,
                 decay_epoch=1, lr=5e-4, vocab_size=200, valid_sentences=20, test_sentences=100, eval_every=0,
                 weight_decay=0.0, dictionaries="joint", src="de", tgt="en", nowarmup_schedule="step"),
}


# --- BERT (pretrain_bert.py) ------------------------------------------------------------------------

RECIPES = {
    # Section 4: "Post-LN: 10k warmup steps to lr_max 1e-4, then linear decay".
    "post-warmup": dict(norm="post", lr=1e-4, no_warmup=False),
    # Section 4: "Pre-LN: linear decay from 3e-4 without warmup".
    "pre-no-warmup": dict(norm="pre", lr=3e-4, no_warmup=True),
}
# GLUE fine-tuning (Appendix A: batch 16 or 32, lr 1e-5 to 1e-4, 3 to 8 epochs, 6 seeds); explicit flags win.
FINETUNE = dict(lr=5e-5, batch_size=32, epochs=3)
FINETUNING = "fine-tuning (Figure 5(b, c); harness/glue.py)"  # its group of --help


@dataclass(frozen=True, kw_only=True)
class BertSpec(_Spec):
    """One pretrain_bert.py job: a pretraining run, or --finetune of pretrained checkpoints. Each field given
    by `setting` is a flag, with its help; pretrain_bert.py's parser is made from them (`cli.spec_parser`)."""

    GROUPS = {"data": None, "model": None, "training": None, "runs": None, FINETUNING: None, DEVICES: None}

    preset: str = setting("cpu", help="the defaults of the flags marked [preset: ...]: cpu (default: minutes on 2 "
                          "cores), base (BERT-base, for GPUs) or tiny (tests)")
    recipe: str = setting("post-warmup", choices=tuple(RECIPES),
                          help="post-warmup (default: Post-LN, warmup to 1e-4) or pre-no-warmup (Pre-LN, 3e-4, no "
                               "warmup); both decay linearly; --norm, --lr, --warmup-updates, --no-warmup override")
    norm: str = setting(concern="model", choices=NORMS,
                        help="LayerNorm placement (default: the recipe's: post-warmup post, pre-no-warmup pre)")  # decided by `build`: the recipe's, unless given
    deepnorm_rule: str = setting("paper", concern="model", choices=("paper", "torchscale", "sgd", "adam", "lamb"),
                                 help="DeepNorm constants for an encoder-only stack (layers.deepnorm_constants); "
                                      "default paper")
    # data
    corpus: tuple | None = setting(None, group="data", nargs="+", metavar="PATH",
                                   help="text files or directories in BERT's format (one sentence a line, a blank line "
                                        "between documents; .gz and .bz2 too); default: the English Wikipedia sample "
                                        "shipped in data/wikipedia")
    vocab_size: int = setting(group="data", help="WordPiece vocabulary (BERT 30522)")
    vocab: str | None = setting(None, group="data", metavar="FILE",
                                help="use this tokenizer (RUN/vocab/wordpiece-*.json of another run) instead of "
                                     "learning one: runs to compare share one vocabulary")
    seq_len: int = setting(group="data", help="tokens per sequence (BERT 128)")
    nsp: bool = setting(False, group="data", help="next-sentence pairs and BERT's NSP head (default off)")
    valid_sequences: int = setting(group="data", help="validation sequences evaluated (0 = all)")
    # model
    layers: int = setting(group="model", help="encoder blocks")
    d_model: int = setting(group="model", help="model width d")
    heads: int = setting(group="model", help="attention heads")
    ffn_dim: int = setting(group="model", help="FFN inner width")
    dropout: float = setting(group="model", help="dropout on embeddings and on each sub-layer's output")
    attention_dropout: float = setting(group="model", help="dropout on the attention probabilities")
    activation: str = setting(group="model", choices=("gelu_tanh", "gelu", "relu"),
                              help="FFN and masked-LM transform (BERT's gelu_tanh, the tanh approximation)")
    initializer: str = setting(group="model", choices=("bert", "xavier"),
                               help="kernels: bert (truncated normal, std 0.02) or xavier (the translation model's)")
    layer_norm_epsilon: float = setting(group="model", help="LayerNorm eps (BERT 1e-12)")
    # training
    steps: int = setting(group="training",
                         concern="optimization", aliases=("--total-num-update", "--steps"), metavar="N",
                         help="updates of the whole schedule: the linear decay reaches 0 there (BERT 1M)")
    max_updates: int = setting(0, group="training", aliases=("--max-update",), metavar="N",
                               help="stop after this many updates (the schedule still spans --total-updates); "
                                    "continue with --resume (default 0: no bound)")
    batch_size: int = setting(group="training",
                              help=f"sequences per update (BERT 256; --finetune {FINETUNE['batch_size']})")
    # decided by `build`: the recipe's (or fine-tuning's), unless given
    lr: float = setting(concern="optimization", group="training",
                        help="peak learning rate (default: the recipe's: post-warmup 1e-4, pre-no-warmup 3e-4; "
                             f"--finetune {FINETUNE['lr']:g})")
    warmup_steps: int = setting(group="training", concern="optimization", aliases=("--warmup-steps",), metavar="N",
                                help="linear warmup updates (paper 10000)")
    # decided by `build`: the recipe's, unless given (an explicit --warmup-updates turns it off)
    no_warmup: bool = setting(group="training", concern="optimization",
                              help="no warmup: decay from the first update (default: the recipe's: pre-no-warmup has "
                                   "none)")
    optimizer: str = setting("adam", concern="optimization", group="training", choices=OPTIMIZERS,
                             help="adam (default; BERT's: AdamW with --adam-betas, --adam-epsilon, --weight-decay), "
                                  "sgd or radam")
    adam_betas: tuple = setting(group="training",
                                concern="optimization", type=float, nargs=2, metavar=("BETA1", "BETA2"),
                                help="Adam's betas (BERT 0.9 0.999)")
    adam_epsilon: float = setting(group="training", concern="optimization", help="Adam's epsilon (BERT 1e-6)")
    weight_decay: float = setting(group="training",
                                  concern="optimization", help="decoupled weight decay (BERT 0.01), never on LayerNorm "
                                  "gamma / beta and biases")
    clip_norm: float = setting(group="training",
                               concern="optimization", help="clip the global gradient norm (BERT 1.0; 0 = off)")
    seed: int = setting(1, group="training",
                        help="seed of the initialisation, dropout, masking and batch order (default 1)")
    eval_every: int = setting(group="training", help="updates between validation losses")
    # early stopping (`callbacks.Plateau`), as translation's: validations without a better loss; 0 = off
    patience: int = setting(0, group="training", metavar="VALIDATIONS",
                            help="stop training once this many validations in a row have not lowered the best "
                                 "validation loss by --min-delta: trained to its plateau (0 = off; default)")
    min_delta: float = setting(0.01, group="training", metavar="NATS",
                               help="with --patience: the improvement in validation loss that counts (default 0.01)")
    log_every: int = setting(50, group="training", metavar="UPDATES",
                             help="when the output is not a terminal, a progress line every UPDATES updates (0 = none; "
                                  "default 50)")
    save_every: int = setting(group="training", help="updates between checkpoints")
    # the run directory
    out: str | None = setting(None, group="runs", aliases=("--save-dir",), metavar="DIR",
                              help="run directory (default runs/NAME)")
    resume: bool = setting(False, group="runs", help="continue the run in --out from its last checkpoint")
    # fine-tuning
    finetune: str | None = setting(None, group=FINETUNING, concern="finetuning", metavar="TASK",
                                   choices=GLUE_TASK_NAMES,
                                   help="mrpc or rte: sentence-pair classification on GLUE")
    glue_dir: str | None = setting(None, group=FINETUNING, concern="finetuning",
                                   help="the task's train.tsv and dev.tsv (or a GLUE folder holding MRPC/, RTE/)")
    init: tuple | None = setting(None, group=FINETUNING, concern="finetuning", nargs="+", metavar="CHECKPOINT",
                                 help="pretraining checkpoints (.keras), or run directories: all their checkpoints")
    seeds: int = setting(6, group=FINETUNING, concern="finetuning",
                         help="fine-tuning runs per checkpoint (paper 6; default 6)")
    epochs: int | None = setting(None, group=FINETUNING, concern="finetuning", aliases=("--max-epoch",), metavar="N",
                                 help=f"fine-tuning epochs (paper 3 to 8; default {FINETUNE['epochs']})")
    # devices and precision
    distribute: str = device_setting("distribute")
    model_parallel: int = device_setting("model_parallel")
    precision: str = device_setting("precision")
    peer_timeout: int = device_setting("peer_timeout")
    given: frozenset = field(default_factory=frozenset)

    @classmethod
    def _derive(cls, values, given):
        recipe = RECIPES[values.get("recipe", "post-warmup")]
        derived = {"norm": recipe["norm"], "lr": recipe["lr"], **(FINETUNE if values.get("finetune") else {})}
        values.update({k: v for k, v in derived.items() if k not in given})
        if "no_warmup" not in given:  # an explicit --warmup-updates turns the warmup on, even in pre-no-warmup
            values["no_warmup"] = recipe["no_warmup"] and "warmup_steps" not in given
        values["adam_betas"] = tuple(values["adam_betas"])
        return values

    finetuning = _concern("finetuning", "GLUE fine-tuning's settings: the task, its files, the checkpoints, the seeds and epochs")

    def name(self):
        """The run's name, and its default directory under runs/."""
        warm = "nowarmup" if self.no_warmup else f"warmup{self.warmup_steps}"
        return f"bert-{self.norm}-{warm}-lr{self.lr:g}-{self.preset}"

    POSITIVE = ("layers", "d_model", "heads", "ffn_dim", "vocab_size", "batch_size", "steps", "eval_every", "save_every",
                "seeds", "epochs")
    NOT_NEGATIVE = ("max_updates", "warmup_steps", "valid_sequences", "log_every", "patience", "min_delta")
    PAUSES = ("max_updates",)  # the schedule still spans --total-updates
    FRACTIONS = ("dropout", "attention_dropout")
    AT_MOST = {"batch_size": MAX_SEQUENCES}

    def _check(self):
        if not 8 <= self.seq_len <= 512:
            raise UsageError(f"--seq-len must be between 8 and 512 (BERT's positions), got {self.seq_len}")
        if self.weight_decay < 0 or self.clip_norm < 0:
            raise UsageError("--weight-decay and --clip-norm must be >= 0")
        if not all(0 <= beta < 1 for beta in self.adam_betas):
            raise UsageError(f"--adam-betas must be in [0, 1), got {' '.join(map(str, self.adam_betas))}")
        if not self.adam_epsilon > 0 or not self.layer_norm_epsilon > 0:
            raise UsageError("--adam-epsilon and --layer-norm-epsilon must be positive")
        check_distribution_arguments(self.devices)
        if self.finetune is not None and (not self.glue_dir or not self.init):
            raise UsageError("--finetune needs --glue-dir (the task's train.tsv and dev.tsv) and --init CHECKPOINT...")


# Devlin et al. 2019's BERT recipe, which the paper follows (Section 4, Appendix A): every preset has it.
DEVLIN = dict(
    # google-research/bert optimization.py create_optimizer: AdamWeightDecayOptimizer(weight_decay_rate=0.01,
    # beta_1=0.9, beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]).
    adam_betas=(0.9, 0.999),
    adam_epsilon=1e-6,
    weight_decay=0.01,  # decoupled (lr * 0.01 * w), and not on LayerNorm gamma / beta or biases: optimizers.NO_DECAY
    clip_norm=1.0,  # optimizers.py: tf.clip_by_global_norm(grads, clip_norm=1.0)
    layer_norm_epsilon=1e-12,  # modeling.py layer_norm: tf.contrib.layers.layer_norm, variance epsilon 1e-12
    activation="gelu_tanh",  # modeling.py gelu: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
    initializer="bert",  # modeling.py create_initializer: truncated normal, std initializer_range = 0.02
)
BertSpec.PRESETS = {
    # BERT-base (Devlin et al.; the paper's Appendix A): 12 layers, 768, 12 heads, FFN 3072, batches of
    # 256 sequences of 128 tokens, 1M updates, 10k warmup. For GPUs and a real corpus (--corpus).
    "base": dict(DEVLIN, layers=12, d_model=768, heads=12, ffn_dim=3072, dropout=0.1, attention_dropout=0.1,
                 vocab_size=30522, seq_len=128, batch_size=256, steps=1_000_000, warmup_steps=10_000,
                 eval_every=10_000, save_every=100_000, valid_sequences=4096),
    # Minutes on 2 CPU cores on the default corpus (about 5,300 training sequences of 128 tokens, so
    # 300 updates are under 2 epochs). The warmup keeps its role, a short start of the run, at 10 %.
    "cpu": dict(DEVLIN, layers=4, d_model=128, heads=4, ffn_dim=512, dropout=0.1, attention_dropout=0.1,
                vocab_size=8000, seq_len=128, batch_size=32, steps=300, warmup_steps=30,
                eval_every=25, save_every=100, valid_sequences=0),
    # For tests and a first look: seconds of training, and a test slice of 100 sentences to decode.
    "tiny": dict(DEVLIN, layers=2, d_model=32, heads=2, ffn_dim=64, dropout=0.0, attention_dropout=0.0,
                 vocab_size=300, seq_len=32, batch_size=8, steps=4, warmup_steps=2,
                 eval_every=2, save_every=2, valid_sequences=16),
}


# --- the analyses (analyze_grads.py) ------------------------------------------------------------------

ANALYSES = ("fig3-layers", "fig3-depth", "lemma2", "after-warmup", "deepnet")


@dataclass(frozen=True, kw_only=True)
class AnalysisSpec(_Spec):
    """One analyze_grads.py job: an analysis (or all) at a preset's size. Each field given by `setting` is an
    argument, with its help; analyze_grads.py's parser is made from them (`cli.spec_parser`)."""

    analysis: str = setting("all", positional=True, nargs="?", choices=("all",) + ANALYSES,
                            help="all (default: each analysis, then a summary table), fig3-layers (Figure 3(a, b)), "
                                 "fig3-depth (Figure 3(c, d)), lemma2 (Lemma 2), after-warmup (Figure 3(a) after "
                                 "warmup) or deepnet (DeepNet's model update against depth)")
    preset: str = setting("cpu", help="the defaults of the flags marked [preset: ...]: cpu (default: minutes on 2 "
                          "cores), paper (d 512, depths 6..14, 10 seeds; a GPU) or tiny (tests)")
    d_model: int = setting(concern="model", help="model width (paper 512)")
    ffn_dim: int = setting(concern="model", help="FFN width (paper 1024)")
    heads: int = setting(concern="model", help="attention heads (paper 4)")
    layers: int = setting(help="layers per stack for fig3-layers, lemma2, after-warmup (paper 6)")
    depths: tuple = setting(type=int_list, metavar="L,L,...", help="fig3-depth stack depths, e.g. 6,8,10,12,14")
    deepnet_depths: tuple = setting(type=int_list, metavar="L,L,...", help="deepnet depths, e.g. 6,12,24,48")
    seeds: int = setting(help="random initializations to average (paper 10)")
    batches: int = setting(help="mini-batches averaged into the expected gradient")
    max_tokens: int = setting(concern="data", help="tokens per batch")
    length: int = setting(concern="data", help="padded sentence length of the analysis batches")
    after_warmup: int = setting(metavar="STEPS", help="warmup updates of Post-LN before measuring again")
    lr: float = setting(5e-4, help="peak lr (after-warmup) and step size (deepnet); default 5e-4")
    norms: tuple = setting(("post", "pre", "deepnorm"), type=comma_names, metavar="NORM,...",
                           help=f"placements for fig3-layers, of {', '.join(NORMS)} (default post,pre,deepnorm)")
    simplified: bool = setting(False, help="lemma2 in the paper's simplified setting (one head, W^Q = W^K = 0, d x d, "
                               "Gaussian input); all runs both")
    corpus: str = setting("multi30k", concern="data", choices=CORPORA,
                          help="built-in corpus of the sentences when no --data-dir (default multi30k, data/multi30k)")
    data_dir: str | None = setting(None, concern="data", help="translation data in fairseq layout; overrides --corpus")
    src: str = setting("de", concern="data", help="source language of --data-dir (default de)")
    tgt: str = setting("en", concern="data", help="target language of --data-dir (default en)")
    random_tokens: bool = setting(False, concern="data", help="random token ids instead of sentences")
    vocab_size: int = setting(concern="data", help="joint BPE vocabulary size")
    loss: str = setting("label_smoothed", choices=("label_smoothed", "cross_entropy"),
                        concern="loss", help="the loss whose gradients are measured (default label_smoothed)")
    label_smoothing: float = setting(0.1, concern="loss", help="with --loss label_smoothed (default 0.1)")
    seed: int = setting(1, help="the first seed of the initialisations, and of the batches (default 1)")
    out: str | None = setting(None, help="output directory (default runs/analysis/PRESET-BACKEND)")
    given: frozenset = field(default_factory=frozenset)

    @classmethod
    def _derive(cls, values, given):
        return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}

    POSITIVE = ("d_model", "ffn_dim", "heads", "layers", "seeds", "batches", "max_tokens", "length", "vocab_size",
                "after_warmup")
    FRACTIONS = ("label_smoothing",)
    AT_MOST = {"max_tokens": MAX_TOKENS}

    # The settings that only some analyses read: given with another analysis alone, they would be ignored.
    ONLY_FOR = {"norms": ("fig3-layers", "after-warmup"), "simplified": ("lemma2",), "depths": ("fig3-depth",),
                "deepnet_depths": ("deepnet",), "after_warmup": ("after-warmup",),
                "layers": ("fig3-layers", "lemma2", "after-warmup"), "lr": ("after-warmup", "deepnet")}

    def _check(self):
        if self.data_dir is not None and not self.random_tokens:
            parallel_splits(self.data_dir, self.src, self.tgt)  # its paths and files: before the backend's import
        bad = [n for n in self.norms if n not in NORMS]
        if bad or not self.norms:
            raise UsageError(f"--norms: unknown placement {', '.join(bad) or '(none)'}; choose from {', '.join(NORMS)}")
        if self.max_tokens < self.length:
            raise UsageError(f"--max-tokens {self.max_tokens} is smaller than --length {self.length}")
        stray = [name for name, analyses in self.ONLY_FOR.items()
                 if name in self.given and self.analysis != "all" and self.analysis not in analyses]
        if stray:
            raise UsageError(f"{self.analysis} does not read "
                             + ", ".join(f"{flag_name(name)} ({' and '.join(self.ONLY_FOR[name])})" for name in stray)
                             + "; drop it, or run the analysis it belongs to")


AnalysisSpec.PRESETS = {
    # A size that finishes `all` in a few minutes on 2 CPU cores, with the paper's 10 seeds (results/protocols.md,
    # 2026-11-29, 7: Theorem 1's slopes carried about +/-0.08 of seed error with 3).
    "cpu": dict(d_model=64, ffn_dim=128, heads=4, layers=6, depths=[2, 4, 6, 8], seeds=10, batches=3,
                max_tokens=1024, length=32, vocab_size=8000, deepnet_depths=[2, 4, 8, 16], after_warmup=150),
    # The paper's sizes (transformer_iwslt_de_en, 10 seeds): for a GPU.
    "paper": dict(d_model=512, ffn_dim=1024, heads=4, layers=6, depths=[6, 8, 10, 12, 14], seeds=10, batches=16,
                  max_tokens=4096, length=64, vocab_size=10000, deepnet_depths=[6, 12, 24, 48], after_warmup=4000),
    # For tests and a first look: seconds of training, and a test slice of 100 sentences to decode.
    "tiny": dict(d_model=32, ffn_dim=64, heads=2, layers=2, depths=[1, 2], seeds=1, batches=1, max_tokens=256,
                 length=16, vocab_size=300, deepnet_depths=[1, 2], after_warmup=2),
}


