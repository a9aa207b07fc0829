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

Each preset's values, with their sources, are below the spec that uses them. The jobs (harness/nmt_job.py,
harness/bert_job.py, harness/grads_job.py) take a spec; the run directory records it (`spec.config()`,
harness/rundir.py).
"""

import dataclasses
from dataclasses import dataclass, field

from harness.constants import DECODING


class _Spec:
    """What the three specs share: building from the given values, rebuilding, and the given values."""

    PRESETS = {}

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

    @property
    def warmup(self):
        """The warmup updates a run's schedule has (translation and BERT): none with --no-warmup, else
        --warmup-updates."""
        return 0 if self.no_warmup else self.warmup_steps

    def flags(self):
        """The values that were given ({field: value}): enough to build this spec again."""
        return {name: getattr(self, name) for name in sorted(self.given)}

    def config(self):
        """Every field, for config.json (`given` as a sorted list)."""
        config = dataclasses.asdict(self)
        config["given"] = sorted(self.given)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()}


# --- translation (train_nmt.py) ---------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class TranslationSpec(_Spec):
    """One train_nmt.py job: a training run, or --eval-only, --translate or --benchmark with its settings.
    The fields are the command line's flags (`--d-model` is `d_model`); `train_nmt.py --help` says what
    each does."""

    # the model and its placement
    norm: str = "post"
    deepnorm_rule: str = "paper"
    qkv_init: str = "toolkit"
    preset: str = "cpu"
    d_model: int
    ffn_dim: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    dropout: float
    attention_dropout: float
    activation_dropout: float
    # data
    corpus: str = "multi30k"
    data_dir: str | None = None
    src: str
    tgt: str
    prepare_iwslt14: str | None = None
    prepare_wmt14: str | None = None
    wmt14_valid: str = "newstest2013"
    vocab_size: int
    dictionaries: str
    max_tokens: int
    batching: str | None = None  # packed for a new run; a resumed run keeps its own (nmt_job)
    valid_sentences: int
    test_sentences: int = 0  # 0: every test sentence (the paper's test BLEU)
    # training
    epochs: int
    max_updates: int = 0
    log_every: int = 50
    eval_every: int
    backup_every: int = 0
    patience: int = 0  # early stopping (`callbacks.Plateau`): validations without a better loss; 0 = off
    min_delta: float = 0.01
    optimizer: str = "adam"
    lr: float
    schedule: str  # decided by `build`: the paper's warmup + inverse sqrt, or the preset's recipe without warmup
    nowarmup_schedule: str  # the preset's recipe without warmup (Section 4)
    warmup_steps: int
    no_warmup: bool = False
    decay_epoch: int
    decay_factor: float  # decided by `build`: 0.1 for step (Section 4), 1 for decay_then_inverse_sqrt
    weight_decay: float
    clip_norm: float = 0.0
    label_smoothing: float = 0.1
    seed: int = 1
    # decoding (validation and test BLEU, --eval-only, --translate)
    beam: int = DECODING["beam"]
    lenpen: float = DECODING["lenpen"]
    max_len_a: float = DECODING["max_len_a"]
    max_len_b: int = DECODING["max_len_b"]
    min_len: int = DECODING["min_len"]
    unkpen: float = DECODING["unkpen"]
    eval_only: str | None = None
    translate: str | None = None
    input: str | None = None
    # the run directory
    out: str | None = None
    resume: bool = False
    # --benchmark
    benchmark: int = 0
    benchmark_sentences: int = 128
    peak_tflops: float | None = None
    # devices and precision
    distribute: str = "auto"
    model_parallel: int = 2
    precision: str = "float32"
    peer_timeout: int = 60
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

@dataclass(frozen=True, kw_only=True)
class BertSpec(_Spec):
    """One pretrain_bert.py job: a pretraining run, or --finetune of pretrained checkpoints. The fields
    are the command line's flags; `pretrain_bert.py --help` says what each does."""

    preset: str = "cpu"
    recipe: str = "post-warmup"
    norm: str  # decided by `build`: the recipe's, unless given
    deepnorm_rule: str = "paper"
    # data
    corpus: tuple | None = None
    vocab_size: int
    vocab: str | None = None
    seq_len: int
    nsp: bool = False
    valid_sequences: int
    # model
    layers: int
    d_model: int
    heads: int
    ffn_dim: int
    dropout: float
    attention_dropout: float
    activation: str
    initializer: str
    layer_norm_epsilon: float
    # training
    steps: int
    max_updates: int = 0
    batch_size: int
    lr: float  # decided by `build`: the recipe's (or fine-tuning's), unless given
    warmup_steps: int
    no_warmup: bool  # decided by `build`: the recipe's, unless given (an explicit --warmup-updates turns it off)
    optimizer: str = "adam"
    adam_betas: tuple
    adam_epsilon: float
    weight_decay: float
    clip_norm: float
    seed: int = 1
    eval_every: int
    log_every: int = 50
    save_every: int
    # the run directory
    out: str | None = None
    resume: bool = False
    # fine-tuning
    finetune: str | None = None
    glue_dir: str | None = None
    init: tuple | None = None
    seeds: int = 6
    epochs: int | None = None
    # devices and precision
    distribute: str = "auto"
    model_parallel: int = 2
    precision: str = "float32"
    peer_timeout: int = 60
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

    def name(self):
        """The run's name, and its default directory under runs/."""
        warm = "nowarmup" if self.no_warmup else f"warmup{self.warmup_steps}"
        return f"bert-{self.norm}-{warm}-lr{self.lr:g}-{self.preset}"


# Devlin et al. 2019's BERT recipe, which the paper follows (Section 4, Appendix A): every preset has it.
DEVLIN = dict(
    # google-research/bert optimization.py create_optimizer: AdamWeightDecayOptimizer(weight_decay_rate=0.01,
    # beta_1=0.9, beta_2=0.999, epsilon=1e-6, exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]).
    adam_betas=(0.9, 0.999),
    adam_epsilon=1e-6,
    weight_decay=0.01,  # decoupled (lr * 0.01 * w), and not on LayerNorm gamma / beta or biases: optimizer_flags.NO_DECAY
    clip_norm=1.0,  # harness/optimizer_flags.py: tf.clip_by_global_norm(grads, clip_norm=1.0)
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
RECIPES = {
    # Section 4: "Post-LN: 10k warmup steps to lr_max 1e-4, then linear decay".
    "post-warmup": dict(norm="post", lr=1e-4, no_warmup=False),
    # Section 4: "Pre-LN: linear decay from 3e-4 without warmup".
    "pre-no-warmup": dict(norm="pre", lr=3e-4, no_warmup=True),
}
# GLUE fine-tuning (Appendix A: batch 16 or 32, lr 1e-5 to 1e-4, 3 to 8 epochs, 6 seeds); explicit flags win.
FINETUNE = dict(lr=5e-5, batch_size=32, epochs=3)


# --- the analyses (analyze_grads.py) ------------------------------------------------------------------

ANALYSES = ("fig3-layers", "fig3-depth", "lemma2", "after-warmup", "deepnet")


@dataclass(frozen=True, kw_only=True)
class AnalysisSpec(_Spec):
    """One analyze_grads.py job: an analysis (or all) at a preset's size. The fields are the command line's
    flags; `analyze_grads.py --help` says what each does."""

    analysis: str = "all"
    preset: str = "cpu"
    d_model: int
    ffn_dim: int
    heads: int
    layers: int
    depths: tuple
    deepnet_depths: tuple
    seeds: int
    batches: int
    max_tokens: int
    length: int
    after_warmup: int
    lr: float = 5e-4
    norms: tuple = ("post", "pre", "deepnorm")
    simplified: bool = False
    corpus: str = "multi30k"
    data_dir: str | None = None
    src: str = "de"
    tgt: str = "en"
    random_tokens: bool = False
    vocab_size: int
    loss: str = "label_smoothed"
    label_smoothing: float = 0.1
    seed: int = 1
    out: str | None = None
    given: frozenset = field(default_factory=frozenset)

    @classmethod
    def _derive(cls, values, given):
        return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


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


