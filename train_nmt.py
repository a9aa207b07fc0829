"""IWSLT14-style translation with Post-LN, Pre-LN or DeepNorm: the warmup experiments (Figures 2 and 4).

    KERAS_BACKEND=jax python train_nmt.py --norm pre --no-warmup         # minutes on a CPU, default data
    KERAS_BACKEND=jax python train_nmt.py --norm post --sweep fig2       # Figure 2 at CPU scale
    python train_nmt.py --prepare-iwslt14 de-en.tgz --data-dir data/iwslt14 --preset iwslt --norm post
    python train_nmt.py --prepare-wmt14 wmt14-archives/ --data-dir data/wmt14 --preset wmt14 --norm pre --no-warmup

Xiong et al. 2020: Post-LN needs the learning-rate warmup (Section 3.2, Figure 2); Pre-LN trains
without it (Section 4, Figure 4). Each run writes runs/NAME/{config.json, metrics.csv, checkpoints/,
results.json, curves.png}; a sweep writes one directory per run and an overlay plot.
"""

import argparse
import json
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

import distribution  # noqa: E402
import nmt_data  # noqa: E402
import wmt14  # noqa: E402
from decoding import (  # noqa: E402
    MAX_LEN,
    beam_search,
    beam_step,
    bleu_scores,
    references,
    text_codec,
    translate,
    translate_text,
)
from training import (  # noqa: E402
    OneLineParser,
    UsageError,
    compiled,
    Progress,
    is_finite,
    load_checkpoint,
    loss_and_gradients,
    open_run_dir,
    plot_panels,
    prepare_out_dir,
    read_csv,
    run_config,
    run_script,
    write_csv,
    write_json,
)

PRESETS = {
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
    #   en -> de, joint BPE ~37K (wmt14.py: 40000 merges)     paper, Appendix A; prepare-wmt14en2de.sh
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
    # For tests.
    "tiny": dict(d_model=32, ffn_dim=64, heads=2, encoder_layers=1, decoder_layers=1, dropout=0.0,
                 attention_dropout=0.0, activation_dropout=0.0, max_tokens=256, epochs=1, warmup_steps=2,
                 decay_epoch=1, lr=5e-4, vocab_size=200, valid_sentences=20, eval_every=0, weight_decay=0.0,
                 dictionaries="joint", src="de", tgt="en", nowarmup_schedule="step"),
}
# Decoding settings and their defaults: the beam and length penalty of the paper's setup (Section 3.2,
# fairseq's IWSLT14 recipe), the length rules and <unk> penalty of fairseq-generate.
DECODING = dict(beam=5, lenpen=1.2, max_len_a=0.0, max_len_b=200, min_len=1, unkpen=0.0)
SCHEDULES = ("inverse_sqrt", "step", "decay_then_inverse_sqrt", "linear", "constant")
NORMS = ("post", "pre", "deepnorm")  # layers.NORMS, here without importing keras (--help needs no backend)
OPTIMIZERS = ("adam", "sgd", "radam")
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
    "cpu": dict(lr="1e-3", warmup=300, fig2_lrs=["1e-3"], fig2_schedule="constant", depths=[6, 12, 24],
                short_warmup=38, fig2_sgd_lrs=["5e-3", "1e-3"],
                fig2_flags="--encoder-layers 6 --decoder-layers 6 --epochs 3", fig4_flags="",
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


# --- command line ---------------------------------------------------------------------------------

def build_parser():
    p = OneLineParser(prog="train_nmt.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--norm", choices=NORMS, help="LayerNorm placement: post (default; --benchmark: pre), pre or "
                   "deepnorm (the paper's Table 1; DeepNet)")
    p.add_argument("--deepnorm-rule", default="paper", choices=("paper", "torchscale"),
                   help="DeepNorm constants of an encoder-decoder: the paper's Table 1 (encoder beta 0.87 (N^4 M)^(-1/16)) "
                        "or the authors' torchscale code (1.15 (N^4 M)^(-1/16)); default paper")
    p.add_argument("--preset", default="cpu", choices=tuple(PRESETS),
                   help="the defaults of the flags marked [preset: ...]: cpu (default: minutes on 2 cores), iwslt "
                   "(the paper's IWSLT14), wmt14 (the paper's WMT14 En-De, en -> de) or tiny (tests)")
    group = p.add_argument_group("data")
    group.add_argument("--corpus", choices=nmt_data.CORPORA, default="multi30k",
                       help="built-in corpus when no --data-dir: multi30k (default, real captions, data/multi30k), "
                       "ding (Debian's trans-de-en) or synthetic (a generated toy task, for fast tests)")
    group.add_argument("--data-dir", help="fairseq layout {train,valid,test}.{src,tgt}; overrides --corpus")
    group.add_argument("--src", help="source language")
    group.add_argument("--tgt", help="target language")
    group.add_argument("--prepare-iwslt14", metavar="ARCHIVE", help="raw IWSLT14 de-en.tgz -> --data-dir (prepare-iwslt14.sh)")
    group.add_argument("--prepare-wmt14", metavar="ARCHIVE_DIR",
                       help="directory of the WMT14 archives -> --data-dir (prepare-wmt14en2de.sh; wmt14.py)")
    group.add_argument("--wmt14-valid", choices=wmt14.VALID_CHOICES, default="newstest2013",
                       help="--prepare-wmt14's validation set: newstest2013 (default, the paper's) or split (the "
                       "script's: every 100th training pair)")
    group.add_argument("--vocab-size", type=int, help="joint BPE vocabulary (paper 10000)")
    group.add_argument("--dictionaries", choices=nmt_data.DICTIONARIES,
                       help="joint: one vocabulary of both sides, one embedding for encoder, decoder and output; "
                            "separate: a vocabulary per side, the decoder's embedding shared with the output "
                            "(fairseq's IWSLT'14 recipe)")
    group.add_argument("--max-tokens", type=int, help="tokens per batch: rows x padded length (paper 4096)")
    group.add_argument("--valid-sentences", type=int, help="validation sentences decoded for BLEU each epoch (0 = all)")
    group = p.add_argument_group("model")
    for flag, text in (("--d-model", "model width d"), ("--ffn-dim", "FFN inner width"),
                       ("--heads", "attention heads"), ("--encoder-layers", "encoder blocks N"),
                       ("--decoder-layers", "decoder blocks M")):
        group.add_argument(flag, type=int, help=text)
    for flag, text in (("--dropout", "dropout on embeddings and on each sub-layer's output"),
                       ("--attention-dropout", "dropout on the attention probabilities"),
                       ("--activation-dropout", "dropout inside the FFN, after its ReLU")):
        group.add_argument(flag, type=float, help=text)
    group = p.add_argument_group("training")
    group.add_argument("--epochs", type=int, help="passes over the training data")
    group.add_argument("--max-updates", type=int, default=0, help="stop after this many updates (0 = no bound)")
    group.add_argument("--log-every", type=int, default=50, metavar="UPDATES",
                       help="when the output is not a terminal, a progress line every UPDATES updates (0 = none; "
                            "default 50)")
    group.add_argument("--eval-every", type=int, metavar="UPDATES",
                       help="validate every UPDATES updates as well as at the end of each epoch (0 = only then)")
    group.add_argument("--backup-every", type=int, default=0, metavar="UPDATES",
                       help="also back up the run (checkpoints/backup.keras) every UPDATES updates within an epoch, "
                            "so that --resume continues mid-epoch (0 = only the epoch checkpoints; default)")
    group.add_argument("--optimizer", default="adam", choices=OPTIMIZERS,
                       help="adam (default; betas 0.9, 0.98, as the paper), sgd (plain, Figure 2) or radam (Figure 4)")
    group.add_argument("--lr", type=float, help="peak learning rate (paper 5e-4 or 1e-3; cpu preset 1e-3)")
    group.add_argument("--schedule", choices=SCHEDULES, help="default: inverse_sqrt with warmup; with --no-warmup step (x0.1 after --decay-epoch; "
                            "preset wmt14: decay_then_inverse_sqrt); "
                            "decay_then_inverse_sqrt: constant until --decay-epoch, then x --decay-factor and inverse sqrt")
    group.add_argument("--warmup-steps", type=int, help="linear warmup updates (paper 4000)")
    group.add_argument("--no-warmup", action="store_true", help="no warmup (inverse_sqrt: the paper's warmup = 1)")
    group.add_argument("--decay-epoch", type=int, help="epoch after which step/decay schedules decay (paper 8; "
                       "WMT14 6)")
    group.add_argument("--decay-factor", type=float,
                       help="the drop at --decay-epoch: default 0.1 for step (Section 4), 1 for decay_then_inverse_sqrt "
                            "(the 35.5-BLEU setting: inverse sqrt from update 8000, no drop)")
    group.add_argument("--weight-decay", type=float,
                       help="decoupled weight decay (iwslt: 1e-4, fairseq's recipe)")
    group.add_argument("--clip-norm", type=float, default=0.0, help="clip the global gradient norm (0 = off)")
    group.add_argument("--label-smoothing", type=float, default=0.1,
                       help="label-smoothed cross entropy (paper and fairseq 0.1; default 0.1)")
    group.add_argument("--seed", type=int, default=1, help="seed of the initialisation, dropout and batch order "
                       "(default 1)")
    group = p.add_argument_group("decoding", "for validation and test BLEU, --eval-only and --translate (which "
                                 "takes the run's own settings from its config.json unless given)")
    group.add_argument("--beam", type=int, help="beam size for test BLEU (1 = greedy; default 5, or the run's "
                       "own with --translate)")
    group.add_argument("--lenpen", type=float, help="length penalty: score / length^lenpen (default 1.2, or the "
                       "run's own with --translate)")
    group.add_argument("--max-len-a", type=float, metavar="A",
                       help="at most A x source length + B tokens before EOS (fairseq-generate's --max-len-a; default 0)")
    group.add_argument("--max-len-b", type=int, metavar="B", help="see --max-len-a (fairseq-generate's --max-len-b; "
                       f"default 200; at most {MAX_LEN} tokens in any case)")
    group.add_argument("--min-len", type=int, help="at least this many tokens before EOS (fairseq-generate's --min-len; "
                       "default 1: no empty translation)")
    group.add_argument("--unkpen", type=float, help="<unk> penalty: log p(<unk>) - UNKPEN (fairseq-generate's --unkpen; "
                       "default 0; inf never generates <unk>)")
    group.add_argument("--eval-only", metavar="CHECKPOINT", help="only decode the test set with this checkpoint")
    group.add_argument("--translate", metavar="RUN_OR_CHECKPOINT",
                       help="translate source lines from standard input (or --input) with a run directory's newest "
                       "checkpoint, or a checkpoint of one: one output line per input line on standard output")
    group.add_argument("--input", metavar="FILE", help="--translate: read source lines from FILE, not standard input")
    group = p.add_argument_group("runs")
    group.add_argument("--out", help="run directory (default runs/NAME)")
    group.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    group.add_argument("--sweep", choices=SWEEPS, help="run one of the papers' comparisons (`sweep_plan`): fig2, "
                       "fig4 or depth; one run directory each under --out, a results table and plots")
    group.add_argument("--runs", type=_name_list, metavar="NAME,...",
                       help="--sweep: only these runs of the sweep's plan (default all; the names are its run directories)")
    group.add_argument("--depths", type=_int_list, metavar="L,L,...",
                       help="--sweep depth: layers per stack (cpu 6,12,24; iwslt 6,12,24,48)")
    group.add_argument("--jobs", type=int, default=1,
                       help="--sweep: runs at a time, each in its own process with cores / jobs threads (default 1)")
    group.add_argument("--benchmark", type=int, default=0, metavar="STEPS",
                       help="time STEPS train steps of the plain-PyTorch reference's workload (bench/torch_reference.py) "
                       "and print one JSON line")
    group.add_argument("--benchmark-sentences", type=int, default=128, metavar="N",
                       help="sentences per benchmark batch (the reference's 128; more to fill a GPU)")
    group.add_argument("--peak-tflops", type=float, metavar="TFLOPS",
                       help="--benchmark: the device's peak TFLOP/s for the step's matrix-product dtype, for MFU "
                       "(model FLOP rate / peak); default: the table PEAK_TFLOPS (H100, H200), none on a CPU")
    distribution.add_arguments(p)
    for action in p._actions:  # each preset-dependent flag shows its default at every preset
        if action.dest in PRESETS["cpu"]:
            values = ", ".join(f"{name} {preset[action.dest]}" for name, preset in PRESETS.items())
            action.help = f"{action.help or ''} [preset: {values}]".strip()
    return p


def _int_list(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of positive integers, e.g. 6,12,24")
    return values


def _name_list(text):
    names = [v.strip() for v in text.split(",") if v.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"{text!r} names no run; give comma-separated run names, e.g. "
                                         "post-warmup-lr1e-3,post-nowarmup-lr1e-3")
    return names


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    # The benchmark's workload is the PyTorch reference's: Pre-LN unless --norm says otherwise.
    args.norm = args.norm or ("pre" if args.benchmark else "post")
    args._decoding_given = {key for key in DECODING if getattr(args, key) is not None}
    for key, value in DECODING.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    # The preset's values the command line set itself (the benchmark keeps only those of the preset).
    args._given = {key for key in PRESETS[args.preset] if getattr(args, key, None) is not None}
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.decay_factor is None:
        args.decay_factor = 1.0 if schedule_name(args) == "decay_then_inverse_sqrt" else 0.1
    return args


def check_args(args):
    if args.prepare_iwslt14 and args.prepare_wmt14:
        raise UsageError("--prepare-iwslt14 and --prepare-wmt14 both write --data-dir; pass one of them")
    if args.runs:
        if not args.sweep:
            raise UsageError("--runs picks runs of a sweep; add --sweep fig2|fig4|depth")
        names = [name for name, _ in sweep_plan(args.sweep, args.preset, args.depths)[1]]
        unknown = [name for name in args.runs if name not in names]
        if unknown:
            raise UsageError(f"--runs {','.join(unknown)}: not in the {args.sweep} sweep at --preset {args.preset}; "
                             f"choose from {', '.join(names)}")
    if args.jobs < 1:
        raise UsageError(f"--jobs must be a positive number of runs at a time, got {args.jobs}")
    positive = ("d_model", "ffn_dim", "heads", "encoder_layers", "decoder_layers", "epochs", "max_tokens",
                "vocab_size", "beam", "decay_epoch")
    for name in positive:
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    for name in ("max_updates", "warmup_steps", "valid_sentences", "eval_every", "log_every", "backup_every"):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not args.lr > 0:
        raise UsageError(f"--lr must be positive, got {args.lr}")
    if args.d_model % args.heads:
        raise UsageError(f"--d-model {args.d_model} must be divisible by --heads {args.heads}")
    for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
        if not 0 <= getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(args, name)}")
    distribution.check_arguments(args)
    if args.benchmark < 0:
        raise UsageError(f"--benchmark must be a positive number of steps, got {args.benchmark}")
    if args.benchmark_sentences < 1:
        raise UsageError(f"--benchmark-sentences must be a positive number, got {args.benchmark_sentences}")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        raise UsageError(f"--peak-tflops must be a positive number of TFLOP/s, got {args.peak_tflops}")
    if args.weight_decay < 0 or args.clip_norm < 0 or args.decay_factor <= 0 or args.lenpen < 0:
        raise UsageError("--weight-decay, --clip-norm and --lenpen must be >= 0 and --decay-factor > 0")
    check_decoding(args)


def check_decoding(args):
    """The length rules of `decoding.beam_search` must leave room for a translation."""
    if not 0 <= args.max_len_a < math.inf:
        raise UsageError(f"--max-len-a must be a number >= 0, got {args.max_len_a}")
    if not 0 <= args.min_len <= min(args.max_len_b, MAX_LEN):
        raise UsageError(f"--min-len {args.min_len} must be >= 0 and at most --max-len-b {args.max_len_b} (and {MAX_LEN})")
    if args.max_len_b < 1:
        raise UsageError(f"--max-len-b must be a positive number of tokens, got {args.max_len_b}")
    if math.isnan(args.unkpen) or args.unkpen == -math.inf:
        raise UsageError(f"--unkpen must be a number or inf, got {args.unkpen}")


def decoding_summary(args):
    return (f"max length {args.max_len_a:g} x source + {args.max_len_b}, min length {args.min_len}, "
            f"unkpen {args.unkpen:g}")


def length_rules(args):
    """The keyword arguments of `decoding.beam_search` (through `translate`) that --max-len-a, --max-len-b
    and --min-len set."""
    return dict(max_len_a=args.max_len_a, max_len_b=args.max_len_b, min_len=args.min_len)


# --- data -----------------------------------------------------------------------------------------

def load_data(args, vocab_dir):
    """Corpus, `nmt_data.Dictionaries` and encoded splits; prints what was loaded."""
    if args.prepare_iwslt14:
        import iwslt14

        if not args.data_dir:
            raise UsageError("--prepare-iwslt14 needs --data-dir: the directory to write the prepared corpus to")
        if not all(os.path.exists(os.path.join(args.data_dir, f"{s}.{l}")) for s in ("train", "valid", "test")
                   for l in (args.src, args.tgt)):
            iwslt14.prepare_iwslt14(args.prepare_iwslt14, args.data_dir, src=args.src, tgt=args.tgt)
    if args.prepare_wmt14:
        if not args.data_dir:
            raise UsageError("--prepare-wmt14 needs --data-dir: the directory to write the prepared corpus to")
        if {args.src, args.tgt} != {"en", "de"}:
            raise UsageError(f"--prepare-wmt14 prepares English-German; --src {args.src} --tgt {args.tgt} do not "
                             "match it (use --src en --tgt de, the paper's direction, or --src de --tgt en)")
        if not all(os.path.exists(os.path.join(args.data_dir, f"{s}.{l}")) for s in ("train", "valid", "test")
                   for l in (args.src, args.tgt)):
            wmt14.prepare_wmt14(args.prepare_wmt14, args.data_dir, valid=args.wmt14_valid)
    corpus = nmt_data.load_corpus(args.data_dir, args.src, args.tgt, seed=args.seed, corpus=args.corpus)
    train = corpus.splits["train"]
    vocab_size, note = vocabulary_size(args, corpus)
    vocab = nmt_data.build_dictionaries(train, vocab_size, vocab_dir, corpus.bpe_split, args.dictionaries)
    # Training drops over-long pairs; valid and test keep every pair (truncated), aligned with the references.
    encoded = {split: nmt_data.encode_pairs(pairs, vocab, drop_long=split == "train")
               for split, pairs in corpus.splits.items()}
    if not encoded["train"]:
        raise UsageError(f"{corpus.name}: no training pair fits in {nmt_data.BUCKETS[-1]} tokens")
    print(f"data: {corpus.description}: " + ", ".join(f"{k} {len(v)}" for k, v in corpus.splits.items())
          + (f"; vocabulary {vocab.target.size}" if vocab.joint else
             f"; vocabularies {vocab.source.size} ({args.src}) and {vocab.target.size} ({args.tgt})")
          + (f" ({note})" if note else ""))
    return corpus, vocab, encoded


def vocabulary_size(args, corpus):
    """(size to ask `nmt_data.build_vocabulary` for, a note saying why it is not --vocab-size).

    BPE-split text (IWSLT14 as fairseq prepares it) keeps every token type, as fairseq-preprocess does;
    only a --vocab-size given on the command line caps it. Raw text gets a BPE learned here: at most
    --vocab-size pieces, and a quarter of the corpus's distinct words (at least 256) when that is
    fewer, so that a small corpus is not split into pieces it has seen once.
    """
    words = {w for pair in corpus.splits["train"] for side in pair for w in side.split()}
    if corpus.bpe_split:
        if "vocab_size" not in args._given:
            return None, f"every token type of the BPE-split training text; --vocab-size {args.vocab_size} not applied"
        dropped = max(0, len(words) - (args.vocab_size - 3))
        return args.vocab_size, (f"--vocab-size {args.vocab_size} keeps the most frequent types; {dropped} of the "
                                 f"{len(words)} types become <unk>" if dropped else "")
    cap = max(256, len(words) // 4)
    if cap < args.vocab_size:
        return cap, (f"asked {args.vocab_size}, capped at {cap}: a quarter of the {len(words)} distinct training "
                     "words")
    return args.vocab_size, ""


# --- model, optimizer, schedule -------------------------------------------------------------------

def build_model(args, vocab):
    """The TranslationTransformer of the flags for `vocab` (`nmt_data.Dictionaries`)."""
    from models import TranslationTransformer

    model = TranslationTransformer(
        vocab.target.size, source_vocab_size=None if vocab.joint else vocab.source.size, d_model=args.d_model, ffn_dim=args.ffn_dim, num_heads=args.heads,
        encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers, norm=args.norm,
        deepnorm_rule=args.deepnorm_rule, dropout=args.dropout, attention_dropout=args.attention_dropout,
        activation_dropout=args.activation_dropout, pad_id=nmt_data.PAD)
    model.build()
    return model


def schedule_name(args):
    """The paper's default: warmup + inverse sqrt (Section 3.2); without warmup, Section 4's recipe of the
    preset (IWSLT14: step decay; WMT14: held, then inverse sqrt)."""
    return args.schedule or (args.nowarmup_schedule if args.no_warmup else "inverse_sqrt")


def make_schedule(args, updates_per_epoch, total_updates):
    """The learning-rate schedule of schedules.py that the flags describe."""
    from schedules import InverseSquareRoot, LinearDecay, LinearWarmup, StepDecay

    name, lr = schedule_name(args), args.lr
    warmup = 0 if args.no_warmup else args.warmup_steps
    if warmup and warmup >= total_updates:
        raise UsageError(f"--warmup-steps {warmup} is not shorter than training ({total_updates} updates); "
                         "lower --warmup-steps or raise --epochs / --max-updates")
    decay_step = args.decay_epoch * updates_per_epoch
    if name == "inverse_sqrt":  # the paper's "warmup = 1" when there is no warmup (Figure 2)
        after = InverseSquareRoot(lr, decay_start=max(warmup, 1))
    elif name == "step":
        after = StepDecay(lr, boundaries=[decay_step], factor=args.decay_factor)
    elif name == "decay_then_inverse_sqrt":
        after = InverseSquareRoot(lr, decay_start=max(decay_step, warmup, 1), factor=args.decay_factor)
    elif name == "linear":
        after = LinearDecay(lr, total_steps=total_updates, decay_start=warmup)
    else:
        after = lr
    return LinearWarmup(warmup, after) if warmup else after


def make_optimizer(args, schedule):
    import keras

    common = dict(learning_rate=schedule)
    if args.clip_norm:
        common["global_clipnorm"] = args.clip_norm
    if args.weight_decay:
        common["weight_decay"] = args.weight_decay
    if args.optimizer == "adam":
        cls = keras.optimizers.AdamW if args.weight_decay else keras.optimizers.Adam
        return cls(beta_1=0.9, beta_2=0.98, epsilon=1e-8, **common)
    if args.optimizer == "sgd":
        return keras.optimizers.SGD(**common)
    from optimizers import RAdam

    return RAdam(beta_1=0.9, beta_2=0.98, epsilon=1e-8, **common)


# --- training -------------------------------------------------------------------------------------

def evaluate_loss(model, batches, setup):
    """Token-weighted mean validation loss."""
    total, count = 0.0, 0
    for inputs, labels in batches:
        n = int((labels != nmt_data.PAD).sum())
        total += float(np.asarray(model.test_on_batch(*setup.pad((inputs, labels))))) * n  # whole batch per replica
        count += n
    return total / max(count, 1)


def gradient_norm(model, loss, batch):
    """Global gradient norm on a fixed training batch (dropout off): how steep the model stands."""
    inputs, labels = batch
    _, grads = loss_and_gradients(model, loss, inputs, labels)
    return float(math.sqrt(sum((g**2).sum() for g in grads)))


def lr_at(schedule, step):
    """The learning rate of update step + 1 (a schedule, or a constant)."""
    from keras import ops

    return float(ops.convert_to_numpy(schedule(step))) if callable(schedule) else float(schedule)


def run_name(args):
    warm = "nowarmup" if args.no_warmup else f"warmup{args.warmup_steps}"
    return f"{args.norm}-{args.optimizer}-{schedule_name(args)}-{warm}-lr{args.lr:g}-{args.preset}"


def train(args):
    """One training run as `args` say, on the devices `distribution.configure` picks."""
    setup = distribution.configure(args)
    with setup.scope():
        return _train(args, setup)


def _train(args, setup):
    import keras

    from callbacks import (Counter, Divergence, EpochBatches, EpochCheckpoint, ProgressLog, Run, StepBackup,
                           Validation, fit)
    from models import LabelSmoothedCrossEntropy

    out, state_path = open_run_dir(default_out(args), args.resume)
    checkpoints = os.path.join(out, "checkpoints")
    keras.utils.set_random_seed(args.seed)
    corpus, vocab, data = load_data(args, os.path.join(out, "vocab"))
    valid_batches = nmt_data.make_batches(data["valid"], args.max_tokens, buckets=nmt_data.BUCKETS)  # few shapes
    probe_batch = nmt_data.make_batches(data["train"][:256], args.max_tokens, seed=0)[0]
    updates_per_epoch = len(nmt_data.make_batches(data["train"], args.max_tokens, seed=0))
    total = args.epochs * updates_per_epoch
    total = min(total, args.max_updates) if args.max_updates else total
    schedule = make_schedule(args, updates_per_epoch, total)
    loss = LabelSmoothedCrossEntropy(args.label_smoothing, pad_id=nmt_data.PAD)
    rows, start_epoch, updates, skip, loss_state = [], 1, 0, 0, None
    if args.resume:
        from models import TranslationTransformer
        from training import load_latest_checkpoint

        try:  # written atomically, so only an outside hand can break it; then the checkpoints alone decide
            state = json.load(open(state_path))
            last = int(state["epoch"])
        except (OSError, ValueError, TypeError, KeyError) as error:
            print(f"warning: {state_path} cannot be read ({type(error).__name__}); resuming from the newest "
                  "checkpoint that loads", file=sys.stderr)
            state, last = {}, None
        model, backup = None, state.get("backup") if last is not None else None
        if backup and int(backup["epoch"]) == last + 1:  # a --backup-every backup within the next epoch
            for name in os.listdir(checkpoints):  # leftovers of interrupted saves
                if name.startswith(".partial-"):
                    os.remove(os.path.join(checkpoints, name))
            try:
                model, path = load_checkpoint(backup["checkpoint"], expect=TranslationTransformer), backup["checkpoint"]
                epoch, skip, loss_state = last + 1, int(backup["batch"]), backup["loss_state"]
            except UsageError as error:
                print(f"warning: {error}; resuming from the newest epoch checkpoint instead", file=sys.stderr)
        if model is None:  # the newest checkpoint that loads; older ones when it is corrupt (a warning says so)
            epoch, model, path = load_latest_checkpoint(checkpoints, upto=last, expect=TranslationTransformer)
        # Rows after the point resumed from (a killed epoch's, or ones redone after a corrupt checkpoint) are dropped.
        if skip:
            updates = int(backup["updates"])
            rows = [r for r in read_csv(os.path.join(out, "metrics.csv")) if int(r["updates"]) <= updates]
            start_epoch = epoch
            print(f"resuming {out} in epoch {epoch} after update {updates} (batch {skip} of {updates_per_epoch}) "
                  f"from {path}")
        else:
            rows = [r for r in read_csv(os.path.join(out, "metrics.csv")) if int(r["epoch"]) <= epoch]
            counts = [int(r["updates"]) for r in rows if int(r["epoch"]) == epoch]
            updates = (int(state["updates"]) if epoch == last and "updates" in state else counts[-1] if counts
                       else int(keras.ops.convert_to_numpy(model.optimizer.iterations)))
            start_epoch = epoch + 1
            print(f"resuming {out} after epoch {epoch} ({updates} updates) from {path}")
    else:
        model = build_model(args, vocab)
        model.compile(optimizer=make_optimizer(args, schedule), loss=loss, jit_compile=distribution.compile_xla(setup))
        write_json(os.path.join(out, "config.json"), run_config(args, dict(
            data=corpus.description, vocab_size=vocab.target.size, updates_per_epoch=updates_per_epoch,
            total_updates=total, schedule=keras.saving.serialize_keras_object(schedule), run_dir=out,
            vocab_file=os.path.relpath(vocab.target.path, out), bpe_split=corpus.bpe_split,
            **({} if vocab.joint else dict(source_vocab_file=os.path.relpath(vocab.source.path, out))))))
    print(f"{run_name(args)}: {model.count_params():,} parameters, {updates_per_epoch} updates per epoch; "
          f"{setup.description}, {args.precision}; run directory {out}")
    if args.preset == "cpu" and not args.data_dir:
        print("hint: --preset iwslt --data-dir DIR trains the paper's model on IWSLT14 (a GPU is advised)")
    setup.build(model, probe_batch)
    greedy_step = beam_step(model, 1, args.unkpen)  # validation BLEU decodes greedily each epoch: compile once
    run_started = time.time()
    valid_subset = data["valid"][: args.valid_sentences or None]
    valid_refs = references(corpus.splits["valid"], corpus)
    run = Run(updates, rows, stop=args.max_updates or None, loss_state=loss_state)

    def validate(model, train_loss, tokens_per_s):
        """A metrics row: validation loss, greedy validation BLEU and the probe's gradient norm."""
        started = time.time()
        row = dict(epoch=run.epoch, updates=run.updates, lr=lr_at(schedule, run.updates - 1), train_loss=train_loss,
                   tokens_per_s=tokens_per_s, valid_loss=evaluate_loss(model, valid_batches, setup))
        hyps = [vocab.target.decode(ids) for ids in translate(model, valid_subset, 1, args.lenpen, args.max_tokens,
                                                              greedy_step, **length_rules(args))]
        row["valid_bleu"] = bleu_scores(hyps, valid_refs[: len(hyps)], corpus, args.tgt)["bleu"]
        row["grad_norm"] = gradient_norm(model, loss, probe_batch)
        row["outcome"] = "ok"
        run.rows.append(row)
        write_csv(os.path.join(out, "metrics.csv"), run.rows)
        print(f"epoch {row['epoch']}, update {row['updates']}: lr {row['lr']:.2e}, train loss {row['train_loss']:.3f}, "
              f"valid loss {row['valid_loss']:.3f}, valid BLEU (greedy) {row['valid_bleu']:.2f}, "
              f"{row['tokens_per_s']:.0f} tok/s, grad norm {row['grad_norm']:.3f}, validation {time.time() - started:.0f}s, "
              f"{time.time() - run_started:.0f}s since start", flush=True)

    def diverged(value):
        run.rows.append(dict(epoch=run.epoch, updates=run.updates, lr=lr_at(schedule, max(run.updates - 1, 0)),
                             train_loss=value, tokens_per_s=float("nan"), valid_loss=float("nan"), valid_bleu=0.0,
                             grad_norm=float("nan"), outcome="diverged"))
        write_csv(os.path.join(out, "metrics.csv"), run.rows)
        print(f"epoch {run.epoch}: the loss became {value} at update {run.updates}: the run diverged "
              "(a result for this paper, not a crash); recorded in metrics.csv and results.json")

    def backup_state(run, path, loss_state):
        """state.json during an epoch: the last finished epoch as before, and the backup to resume from."""
        state = json.load(open(state_path)) if os.path.exists(state_path) else dict(epoch=0, updates=0)
        return dict(state, backup=dict(epoch=run.epoch, batch=run.batch, updates=run.updates, checkpoint=path,
                                       loss_state=loss_state))

    # The batch order of each epoch is a function of (--seed, epoch); a resumed epoch skips what was trained.
    dataset = EpochBatches(lambda epoch: nmt_data.make_batches(data["train"], args.max_tokens,
                                                               seed=args.seed * 100003 + epoch),
                           updates_per_epoch, start_epoch, skip=skip, pad=setup.pad, pad_id=nmt_data.PAD)
    progress = Progress(total, start=updates, every=args.log_every)
    callbacks = [
        Counter(run, dataset),
        Divergence(run, diverged),
        ProgressLog(run, progress, lambda step: lr_at(schedule, step), dataset),
        # Every --eval-every updates since the last validation, and at the end of each epoch.
        Validation(run, validate, lambda now, last: args.eval_every and now - last >= args.eval_every, progress),
        EpochCheckpoint(run, checkpoints, state_path),
    ]
    if args.backup_every:  # within an epoch only: at its end the epoch checkpoint is written instead
        callbacks.append(StepBackup(
            run, checkpoints, state_path, name=lambda run: "backup", state=backup_state,
            due=lambda run: run.updates % args.backup_every == 0 and run.batch < updates_per_epoch
            and not (run.stop and run.updates >= run.stop)))
    if skip:  # fit runs len(dataset) updates an epoch: the rest of the interrupted epoch is a fit of its own
        fit(model, dataset, run, callbacks, epochs=start_epoch, initial_epoch=start_epoch - 1)
        dataset.skip, start_epoch = 0, start_epoch + 1
    if run.outcome != "diverged":
        fit(model, dataset, run, callbacks, epochs=args.epochs, initial_epoch=start_epoch - 1)
    rows, updates, outcome = run.rows, run.updates, run.outcome
    valid = [r for r in rows if is_finite(r["valid_loss"])]
    result = dict(run=run_name(args), out=out, outcome=outcome, epochs=int(rows[-1]["epoch"]) if rows else 0,
                  updates=updates, data=corpus.description, norm=args.norm, layers=[args.encoder_layers, args.decoder_layers],
                  lr=args.lr, warmup=not args.no_warmup, schedule=schedule_name(args), optimizer=args.optimizer,
                  best_valid_loss=min((float(r["valid_loss"]) for r in valid), default=None),
                  final_valid_loss=float(valid[-1]["valid_loss"]) if valid else None,
                  best_valid_bleu=max((float(r["valid_bleu"]) for r in valid), default=None),
                  train_minutes=round((time.time() - run_started) / 60, 2))
    if outcome != "diverged":
        result.update(test(model, corpus, vocab, data["test"], args, greedy_step if args.beam == 1 else None))
    write_json(os.path.join(out, "results.json"), result)
    plot_runs({run_name(args): rows}, os.path.join(out, "curves.png"))
    return result


def test(model, corpus, vocab, examples, args, step_fn=None):
    print(f"test: decoding {len(examples)} sentences, beam {args.beam}", flush=True)
    started = time.time()
    hyps = [vocab.target.decode(ids) for ids in translate(model, examples, args.beam, args.lenpen, args.max_tokens,
                                                          step_fn, args.unkpen, **length_rules(args))]
    scores = bleu_scores(hyps, references(corpus.splits["test"], corpus)[: len(hyps)], corpus, args.tgt)
    scores.update(test_sentences=len(hyps), beam=args.beam, lenpen=args.lenpen, unkpen=args.unkpen, **length_rules(args),
                  sentences_per_s=round(len(hyps) / (time.time() - started), 2), example=hyps[:3])
    print(f"test BLEU {scores['bleu']:.2f} ({scores['signature']}); tokenized BLEU {scores['tokenized_bleu']:.2f}; "
          f"beam {args.beam}, lenpen {args.lenpen}, {decoding_summary(args)}, {len(hyps)} sentences, "
          f"{time.time() - started:.0f}s")
    return {f"test_{k}" if not k.startswith("test") else k: v for k, v in scores.items()}


def eval_only(args):
    from models import TranslationTransformer

    model = load_checkpoint(args.eval_only, expect=TranslationTransformer)
    run_dir = os.path.dirname(os.path.dirname(os.path.abspath(args.eval_only)))
    config = model.get_config()
    args.dictionaries = "joint" if config.get("source_vocab_size") is None else "separate"  # the checkpoint's own
    corpus, vocab, data = load_data(args, os.path.join(run_dir, "vocab"))
    sizes = (config["vocab_size"], config.get("source_vocab_size") or config["vocab_size"])
    if (vocab.target.size, vocab.source.size) != sizes:
        raise UsageError(f"{args.eval_only} has a vocabulary of {sizes[0]} but the data gives "
                         f"{vocab.target.size}; pass the --data-dir and --vocab-size it was trained with"
                         if sizes[0] != vocab.target.size else
                         f"{args.eval_only} has a source vocabulary of {sizes[1]} but the data gives {vocab.source.size}; "
                         "pass the --data-dir and --vocab-size it was trained with")
    result = test(model, corpus, vocab, data["test"], args)
    write_json(os.path.join(run_dir, "eval.json"), result)
    return result


def translate_stream(args):
    """--translate RUN_OR_CHECKPOINT: source lines in (standard input or --input), translations out.

    What fairseq-interactive gives: the run's own vocabulary, preprocessing and decoding settings (beam,
    length penalty and rules, <unk> penalty from its config.json; the flags override them); exactly one line on standard output per input line, in order, and
    everything else on standard error, so that the command composes in a pipe (`... | sacrebleu ref.en`).
    Lines are translated as they arrive from a terminal, in chunks of 256 otherwise.
    """
    import contextlib
    import itertools

    if args.input and not os.path.isfile(args.input):
        raise UsageError(f"--input {args.input}: no such file; pass a text file with one sentence a line")
    with contextlib.redirect_stdout(sys.stderr):  # messages of the libraries stay off the translations
        model, run_dir, checkpoint = _translation_checkpoint(args.translate)
        config, vocab = _run_vocabulary(run_dir, model)
        for key in DECODING:  # the run's own settings; older runs' config.json lack the length rules
            if key not in args._decoding_given and key in config:
                setattr(args, key, config[key])
        check_decoding(args)
        codes = os.path.join(config.get("data_dir") or "", "code")
        codec = text_codec(vocab.source, open(codes, encoding="utf-8").read() if config.get("bpe_split") and
                           os.path.isfile(codes) else None, config.get("src", "de"), config.get("tgt", "en"))
        step = beam_step(model, args.beam, args.unkpen)
    print(f"translating with {checkpoint}: beam {args.beam}, lenpen {args.lenpen}, {decoding_summary(args)}",
          file=sys.stderr, flush=True)
    stream = open(args.input, "rb") if args.input else sys.stdin.buffer
    chunk, number = (1 if stream.isatty() else 256), 0
    while True:
        raw = list(itertools.islice(stream, chunk))
        if not raw:
            break
        lines = []
        for line in raw:
            number += 1
            try:
                lines.append(line.decode("utf-8").rstrip("\n").rstrip("\r"))
            except UnicodeDecodeError:
                raise UsageError(f"input line {number} is not valid UTF-8; convert the text to UTF-8 (e.g. with "
                                 "iconv)") from None
        with contextlib.redirect_stdout(sys.stderr):
            outputs = translate_text(model, vocab, lines, args.beam, args.lenpen, config.get("max_tokens", 4096),
                                     step, codec, **length_rules(args))
        sys.stdout.write("".join(line + "\n" for line in outputs))
        sys.stdout.flush()
    return number


def _translation_checkpoint(path):
    """(model, run directory, checkpoint path) of a run directory's newest checkpoint, or of a checkpoint."""
    from models import TranslationTransformer
    from training import load_latest_checkpoint

    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        _, model, checkpoint = load_latest_checkpoint(os.path.join(path, "checkpoints"), expect=TranslationTransformer,
                                                      clean=False)
        return model, path, checkpoint
    model = load_checkpoint(path, expect=TranslationTransformer)
    return model, os.path.dirname(os.path.dirname(os.path.abspath(path))), path


def _run_vocabulary(run_dir, model):
    """The config.json and the `nmt_data.Dictionaries` of the run that wrote `run_dir`, checked against the model."""
    try:
        config = json.load(open(os.path.join(run_dir, "config.json")))
    except (OSError, ValueError):
        raise UsageError(f"{run_dir}: no readable config.json; --translate needs a run directory of train_nmt.py or "
                         "a checkpoint inside one (RUN/checkpoints/epochN.keras)") from None
    vocab_dir = os.path.join(run_dir, "vocab")
    if config.get("vocab_file"):
        path = os.path.join(run_dir, config["vocab_file"])
    else:  # a run directory holds the one vocabulary it was trained with
        found = [n for n in sorted(os.listdir(vocab_dir)) if n.endswith(".model") or n.startswith("vocab-")] \
            if os.path.isdir(vocab_dir) else []
        if len(found) != 1:
            raise UsageError(f"{vocab_dir}: expected the run's one vocabulary file, found {len(found)}")
        path = os.path.join(vocab_dir, found[0])
    vocab = nmt_data.load_vocabulary(path)
    source = nmt_data.load_vocabulary(os.path.join(run_dir, config["source_vocab_file"])) \
        if config.get("source_vocab_file") else vocab
    sizes = model.get_config()
    for which, path, size in ((vocab, path, sizes["vocab_size"]),
                              (source, source.path, sizes.get("source_vocab_size") or sizes["vocab_size"])):
        if which.size != size:
            raise UsageError(f"{path} has {which.size} entries but the checkpoint's model has {size}; the checkpoint "
                             "belongs to another run")
    return config, nmt_data.Dictionaries(source, vocab)


# --- speed -----------------------------------------------------------------------------------------

BENCHMARK_LENGTH = 32  # source and target tokens per sentence, as in the plain-PyTorch reference (bench/torch_reference.py)


def benchmark(args):
    """Time train steps of the PyTorch reference's workload and print one JSON line.

    The workload: transformer_iwslt_de_en size (512 / 1024 / 4 heads / 6 + 6, 10k shared vocabulary),
    Pre-LN, dropout 0.1 on residuals, attention probabilities and FFN activations (as torch's
    nn.Transformer applies it), label smoothing 0.1, Adam; 128 sentences x 32 random source and target
    tokens. A --preset other than the default, or model flags (--d-model, --norm, ...), change it. The
    figure to compare is `tgt_tokens_per_s`, the median over the timed steps after two warm-up steps.
    """
    import keras

    from models import LabelSmoothedCrossEntropy, TranslationTransformer

    explicit = args._given | (set(PRESETS[args.preset]) if args.preset != "cpu" else set())
    model_args = dict(PRESETS["iwslt"], dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, vocab_size=10000)
    model_args.update({k: getattr(args, k) for k in model_args if k in explicit})
    setup = distribution.configure(args)
    keras.utils.set_random_seed(args.seed)
    sentences, length = args.benchmark_sentences, BENCHMARK_LENGTH
    rng = np.random.default_rng(0)
    source = rng.integers(4, model_args["vocab_size"], (sentences, length)).astype("int32")
    target = rng.integers(4, model_args["vocab_size"], (sentences, length + 1)).astype("int32")
    batch = ({"source_ids": source, "decoder_input_ids": target[:, :-1]}, target[:, 1:])
    with setup.scope():
        model = TranslationTransformer(
            model_args["vocab_size"], d_model=model_args["d_model"], ffn_dim=model_args["ffn_dim"],
            num_heads=model_args["heads"], encoder_layers=model_args["encoder_layers"],
            decoder_layers=model_args["decoder_layers"], norm=args.norm, dropout=model_args["dropout"],
            attention_dropout=model_args["attention_dropout"], activation_dropout=model_args["activation_dropout"])
        model.build()
        model.compile(optimizer=keras.optimizers.Adam(args.lr, beta_1=0.9, beta_2=0.98, epsilon=1e-8),
                      loss=LabelSmoothedCrossEntropy(args.label_smoothing), jit_compile=distribution.compile_xla(setup))
        setup.build(model, batch)
    traces = _count_traces(model)
    sharded = setup.shard(batch)
    started = time.perf_counter()
    float(np.asarray(model.train_on_batch(*sharded)))  # compiles
    compile_s = time.perf_counter() - started
    for _ in range(2):  # warm-up
        float(np.asarray(model.train_on_batch(*sharded)))
    traced_before, times = traces[0], []
    for _ in range(args.benchmark):
        started = time.perf_counter()
        float(np.asarray(model.train_on_batch(*sharded)))
        times.append(time.perf_counter() - started)
    median = float(np.median(times))
    decoding = _decoding_speed(model, source[:32])
    result = dict(system=f"keras-{keras.backend.backend()}", keras=keras.__version__, device=setup.description,
                  runtime=dict(distribution.RUNTIME), precision=args.precision, norm=args.norm, params=model.count_params(),
                  dropout={k: model_args[k] for k in ("dropout", "attention_dropout", "activation_dropout")},
                  sentences=sentences, length=length, steps=args.benchmark, compile_s=round(compile_s, 3),
                  median_step_s=round(median, 4), tgt_tokens_per_s=round(sentences * length / median, 1),
                  retraced_after_warmup=traces[0] - traced_before if keras.backend.backend() != "torch" else None,
                  **decoding, **_memory_and_flops(model_args, sentences, length, median, args.peak_tflops))
    print(json.dumps(result), flush=True)
    return result


def _decoding_speed(model, source, beam=5):
    """Beam-5 sentences per second on `source`, and the cost of one cached decoder step early and late
    in the output: with the cache it is flat in the position (no re-reading of the prefix)."""
    from keras import ops

    search_step = beam_step(model, beam)
    # 47 tokens and EOS, the length of the measured lines (results/speed): an untrained model does not end itself.
    length = dict(max_len_a=0, max_len_b=47)
    beam_search(model, source, beam, step_fn=search_step, **length)  # compiles (the same shapes as the timed run)
    started = time.perf_counter()
    hypotheses = beam_search(model, source, beam, step_fn=search_step, **length)
    seconds = time.perf_counter() - started
    step_fn = compiled(model, model.decode_step)
    rows, steps = source.shape[0] * beam, 64
    encoder_output, mask = model.encode(np.repeat(source, beam, axis=0), training=False)
    cross, cache = model.cross_attention_cache(encoder_output), model.init_cache(rows, steps)
    last, times = np.full((rows, 1), nmt_data.EOS, "int32"), []
    for index in range(steps):
        started = time.perf_counter()
        logits, cache = step_fn(last, ops.convert_to_tensor(index, "int32"), mask, cache, cross)
        ops.convert_to_numpy(ops.cast(logits[0, 0], "float32"))  # numpy has no bfloat16
        times.append(time.perf_counter() - started)
    return dict(beam5_sentences_per_s=round(len(hypotheses) / seconds, 2),
                beam5_mean_output_tokens=round(float(np.mean([len(h) + 1 for h in hypotheses])), 1),
                decode_step_ms_positions_1_to_8=round(1000 * float(np.median(times[1:9])), 2),
                decode_step_ms_positions_56_to_64=round(1000 * float(np.median(times[-8:])), 2))


def _count_traces(model):
    """Count how often Keras's train step is traced: under jax.jit and tf.function the Python
    `train_step` runs once per compilation, so a count that grows after warm-up means recompiling."""
    count = [0]
    step = model.train_step

    def counted(*args, **kwargs):
        count[0] += 1
        return step(*args, **kwargs)

    model.train_step = counted
    return count


# Dense peak TFLOP/s of known accelerators by the arithmetic of the step's matrix products, for MFU
# (model FLOP rate / peak). NVIDIA H100 SXM datasheet: 989 bfloat16 and float16 and 494 TF32 on the tensor
# cores (dense, without sparsity), 67 float32 on the CUDA cores; the H200 has the same compute. Other
# devices (the H100 PCIe and NVL, CPUs) have no entry: pass --peak-tflops.
PEAK_TFLOPS = {
    "H100": {"bfloat16": 989.0, "float16": 989.0, "tf32": 494.0, "float32": 67.0},
    "H200": {"bfloat16": 989.0, "float16": 989.0, "tf32": 494.0, "float32": 67.0},
}


def peak_tflops(device_name, arithmetic):
    """The table's peak for a device name (as CUDA reports it, e.g. "NVIDIA H100 80GB HBM3") and the
    products' arithmetic (bfloat16, float16, tf32 or float32); None when the device is not listed."""
    if any(variant in device_name for variant in ("PCIe", "NVL")):
        return None
    for key, peaks in PEAK_TFLOPS.items():
        if key in device_name:
            return peaks.get(arithmetic)
    return None


def train_flops(model_args, sentences, length):
    """Model FLOPs of one train step of the benchmark's encoder-decoder: 6 x (matrix-product weights) per
    target token plus attention, forward x 1 and backward x 2. The products: per encoder layer
    W^Q, W^K, W^V, W^O (4 d^2) and the FFN (2 d ffn); per decoder layer self- and cross-attention (8 d^2)
    and the FFN; the tied output projection (d vocab). Attention: the scores Q K^T and the weighted sum
    over `length` positions, 2 x 2 x length x d per token and attention block (encoder self, decoder self
    and cross; the causal mask is not subtracted). Embedding look-ups, LayerNorm, softmax and Adam are
    not counted. `bench/torch_reference.py` uses the same count."""
    d, ffn, vocab = model_args["d_model"], model_args["ffn_dim"], model_args["vocab_size"]
    n_enc, n_dec = model_args["encoder_layers"], model_args["decoder_layers"]
    matmul_params = n_enc * (4 * d * d + 2 * d * ffn) + n_dec * (8 * d * d + 2 * d * ffn) + d * vocab
    attention = 2 * 2 * length * d * (n_enc + 2 * n_dec)  # scores and weighted sum, per token
    return 3 * sentences * length * (2 * matmul_params + attention)  # forward x 1, backward x 2


def utilisation(tokens_per_s, flop_per_token, matmul_tflops, peak):
    """The two fractions the speed table reports: MFU, the model FLOP rate over the device's peak
    (None without a peak), and the product-bound fraction, the model FLOP rate over the measured rate
    of one FFN-sized matrix product (`_matmul_tflops`): 1 would be a step whose every FLOP ran as fast
    as that lone product, with all other operations free."""
    tflops = tokens_per_s * flop_per_token / 1e12
    return dict(mfu=significant(tflops / peak) if peak else None,
                matmul_bound_fraction=significant(tflops / matmul_tflops) if matmul_tflops else None)


def significant(value, digits=4):
    """`value` to `digits` significant digits: the tiny rates of a test model do not round to 0."""
    return float(f"{value:.{digits}g}")


def _device_name():
    """The accelerator's name as its runtime reports it (e.g. "NVIDIA H100 80GB HBM3"), or "cpu"."""
    import keras

    backend = keras.backend.backend()
    try:
        if backend == "jax":
            import jax

            device = jax.devices()[0]
            return device.device_kind if device.platform == "gpu" else "cpu"
        if backend == "torch":
            import torch

            return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "gpu") if gpus else "cpu"
    except Exception:  # a name is an extra: MFU then needs --peak-tflops
        return "unknown"


def _product_arithmetic():
    """The arithmetic of the step's matrix products on a GPU: the policy's half type, else float32 as the
    backend runs it: TF32 tensor cores under jax (its default precision) and tensorflow (TF32 execution
    on by default), plain float32 under torch unless torch.backends.cuda.matmul.allow_tf32 is set."""
    import keras

    compute = keras.config.dtype_policy().compute_dtype
    if compute != "float32":
        return compute
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return "float32" if jax.config.jax_default_matmul_precision in ("highest", "float32") else "tf32"
    if backend == "torch":
        import torch

        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "float32"
    import tensorflow as tf

    return "tf32" if tf.config.experimental.tensor_float_32_execution_enabled() else "float32"


def _memory_and_flops(model_args, sentences, length, step_s, peak=None):
    """Peak memory (the accelerator's where the backend reports it, else the process's resident set),
    the model FLOP rate (`train_flops`), the rate of one FFN-sized matrix product, MFU against the
    device's peak (`peak`, else `peak_tflops`) and the product-bound fraction (`utilisation`)."""
    import resource

    import keras

    d, ffn = model_args["d_model"], model_args["ffn_dim"]
    tokens = sentences * length
    flops = train_flops(model_args, sentences, length)
    memory = dict(peak_host_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
    backend = keras.backend.backend()
    try:
        if backend == "jax":
            import jax

            stats = jax.devices()[0].memory_stats() or {}
            if "peak_bytes_in_use" in stats:
                memory["peak_device_mb"] = round(stats["peak_bytes_in_use"] / 2**20, 1)
        elif backend == "torch":
            import torch

            if torch.cuda.is_available():
                memory["peak_device_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        else:
            import tensorflow as tf

            if tf.config.list_physical_devices("GPU"):
                memory["peak_device_mb"] = round(tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20, 1)
    except Exception:  # memory statistics are optional extras of each runtime
        pass
    matmul = _matmul_tflops(tokens, d, ffn)
    device, arithmetic = _device_name(), _product_arithmetic()
    basis = "--peak-tflops" if peak else None
    if not peak and device != "cpu":
        peak = peak_tflops(device, arithmetic)
        basis = f"{device}, dense {arithmetic}" if peak else None
    return dict(memory, device_name=device, flop_per_tgt_token=flops // tokens,
                model_tflops_per_s=significant(flops / step_s / 1e12), matmul_tflops_per_s=significant(matmul),
                matmul_bound_tokens_per_s=round(sentences * length * matmul * 1e12 / flops, 1),
                peak_tflops=peak, peak_basis=basis, **utilisation(tokens / step_s, flops / tokens, matmul, peak))


def _matmul_tflops(rows, d, ffn, repeats=5):
    """The FLOP rate of one (rows x d) @ (d x ffn) product in the compute dtype, the FFN's first matrix
    product: the rate the step would reach if all of its FLOPs ran like this one. With the model FLOPs
    above it bounds the tokens/s of any implementation of the model on this device and runtime."""
    import keras
    from keras import ops

    dtype = keras.config.dtype_policy().compute_dtype
    rng = np.random.default_rng(0)
    a = ops.convert_to_tensor(rng.standard_normal((rows, d)).astype("float32"), dtype)
    b = ops.convert_to_tensor(rng.standard_normal((d, ffn)).astype("float32"), dtype)
    ops.convert_to_numpy(ops.cast(ops.sum(ops.matmul(a, b)), "float32"))  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        c = ops.matmul(a, b)
    ops.convert_to_numpy(ops.cast(ops.sum(c), "float32"))  # waits for the device
    return 2 * rows * d * ffn * repeats / (time.perf_counter() - started) / 1e12


# --- sweeps and plots -----------------------------------------------------------------------------

def plot_runs(curves, path):
    """Validation loss and greedy BLEU against updates, one line per run."""
    panels = [(label, {name: ([int(r["updates"]) for r in rows], [float(r[key]) for r in rows], None)
                       for name, rows in curves.items()})
              for key, label in (("valid_loss", "validation loss"), ("valid_bleu", "validation BLEU (greedy)"))]
    plot_panels(path, "updates", panels)


def sweep(args, argv):
    """Run the runs of `sweep_plan` (skipping finished ones, resuming stopped ones with --resume), then
    write results-NAME.csv, the overlay plots and a table on standard output."""
    out = prepare_out_dir(default_out(args))
    defaults, runs = sweep_plan(args.sweep, args.preset, args.depths)
    parser = build_parser()
    arity = {flag: 0 if action.nargs == 0 else 1 for flag, action in parser._option_string_actions.items()}
    if args.runs:  # names checked by check_args
        runs = [(name, flags) for name, flags in runs if name in args.runs]
    own = {"--sweep", "--out", "--resume", "--jobs", "--depths", "--runs"}
    todo, results = [], {}
    for name, flags in runs:
        run_dir = os.path.join(out, name)
        resume = ["--resume"] if args.resume and os.path.exists(os.path.join(run_dir, "state.json")) else []
        # The command line's flags, but not those that define this run (they would blur the comparison).
        defining = {token for token in flags if token.startswith("--")} | own
        run_argv = defaults + _strip(argv, {flag: arity[flag] for flag in defining}) + flags + ["--out", run_dir] + resume
        check_args(parse_args(run_argv))  # every run's flags are checked before the first one starts
        if os.path.exists(os.path.join(run_dir, "results.json")):
            print(f"== {name}: done already ({run_dir})")
            results[name] = json.load(open(os.path.join(run_dir, "results.json")))
        else:
            todo.append((name, run_dir, run_argv))
    if args.jobs == 1:
        for name, run_dir, run_argv in todo:
            print(f"== {name}", flush=True)
            results[name] = train(parse_args(run_argv))
    else:  # the deepest runs first, so that the cores stay busy to the end
        todo.sort(key=lambda run: -sum(vars(parse_args(run[2]))[k] for k in ("encoder_layers", "decoder_layers")))
        results.update(_run_in_processes(todo, args.jobs))
    curves = {name: read_csv(os.path.join(out, name, "metrics.csv")) for name, _ in runs}
    table = [dict(run=name, norm=r["norm"], layers=r["layers"][0], outcome=r["outcome"], updates=r["updates"],
                  best_valid_loss=r["best_valid_loss"], final_valid_loss=r["final_valid_loss"],
                  best_valid_bleu=r["best_valid_bleu"], test_bleu=r.get("test_bleu"),
                  test_tokenized_bleu=r.get("test_tokenized_bleu"), minutes=r.get("train_minutes"))
             for name, r in ((name, results[name]) for name, _ in runs)]
    write_csv(os.path.join(out, f"results-{args.sweep}.csv"), table)
    plot_runs(curves, os.path.join(out, f"curves-{args.sweep}.png"))
    if args.sweep == "depth":
        plot_depth(table, curves, os.path.join(out, "depth.png"))
    print(f"\n{'run':<24} {'outcome':<9} {'valid loss':>10} {'test BLEU':>9} {'tok. BLEU':>9} {'minutes':>7}")
    for row in table:
        show = lambda v, f=".2f": format(v, f) if v is not None else "-"  # noqa: E731
        print(f"{row['run']:<24} {row['outcome']:<9} {show(row['final_valid_loss'], '.3f'):>10} "
              f"{show(row['test_bleu']):>9} {show(row['test_tokenized_bleu']):>9} {show(row['minutes'], '.1f'):>7}")
    print(f"plots: {os.path.join(out, f'curves-{args.sweep}.png')}"
          + (f", {os.path.join(out, 'depth.png')}" if args.sweep == "depth" else ""))
    return table


def _run_in_processes(todo, jobs):
    """Run `jobs` runs at a time, each `train_nmt.py RUN_ARGV` in its own process with cores / jobs
    threads (its output in RUN/train.log); returns {name: results.json}. Two single-threaded runs on
    two cores do more work than two two-threaded runs one after the other: the small matrices of the
    CPU presets keep a second thread only partly busy."""
    import subprocess

    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    env = dict(os.environ, OMP_NUM_THREADS=threads, TF_NUM_INTRAOP_THREADS=threads, TF_NUM_INTEROP_THREADS="1",
               XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS"), f"--xla_cpu_multi_thread_eigen={threads != '1'}".lower(),
                                                f"intra_op_parallelism_threads={threads}"])))
    pending, running, results, failed = list(todo), {}, {}, []
    while pending or running:
        while pending and len(running) < jobs:
            name, run_dir, run_argv = pending.pop(0)
            os.makedirs(run_dir, exist_ok=True)
            log = open(os.path.join(run_dir, "train.log"), "ab")
            running[name] = (subprocess.Popen([sys.executable, os.path.abspath(__file__), *run_argv], env=env,
                                              stdout=log, stderr=subprocess.STDOUT), run_dir, log)
            print(f"== {name}: started ({threads} thread{'s' if threads != '1' else ''}; log {run_dir}/train.log)",
                  flush=True)
        time.sleep(2)
        for name, (proc, run_dir, log) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[name]
            done = os.path.join(run_dir, "results.json")
            if proc.returncode != 0 or not os.path.exists(done):
                failed.append(f"{name} (exit code {proc.returncode}; see {run_dir}/train.log)")
                continue
            results[name] = json.load(open(done))
            print(f"== {name}: {results[name]['outcome']}, test BLEU {results[name].get('test_bleu', '-')}", flush=True)
    if failed:
        raise UsageError(f"sweep runs failed: {', '.join(failed)}; fix the cause and rerun the sweep with --resume")
    return results


def plot_depth(table, curves, path):
    """DeepNet's Figure 1 / Table 1 at this scale: test BLEU against depth, one line per placement
    (a diverged run at 0), and the training loss against updates, one panel per depth."""
    names = {"post": "Post-LN", "pre": "Pre-LN", "deepnorm": "DeepNorm"}
    bleu = {}
    for row in table:
        xs, ys, _ = bleu.setdefault(names[row["norm"]], ([], [], None))
        xs.append(int(row["layers"]))
        ys.append(float(row["test_tokenized_bleu"] or 0.0))
    panels = [("test BLEU (tokenized)", bleu, "layers (encoder = decoder)")]
    for depth in sorted({int(row["layers"]) for row in table}):
        panels.append((f"training loss, {depth} + {depth} layers", {
            names[row["norm"]]: ([int(r["updates"]) for r in curves[row["run"]]],
                                 [float(r["train_loss"]) for r in curves[row["run"]]], None)
            for row in table if int(row["layers"]) == depth}, "updates"))
    plot_panels(path, None, panels)


def _strip(argv, flags):
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


def dispatch(args, argv):
    if args.translate:
        return translate_stream(args)
    if args.benchmark:
        return benchmark(args)
    if args.eval_only:
        return eval_only(args)
    if args.sweep:
        return sweep(args, argv)
    return train(args)


def default_out(args):
    """The directory a command writes: --out, or one under runs/ named after the job."""
    return args.out or os.path.join("runs", f"sweep-{args.sweep}-{args.preset}" if args.sweep else run_name(args))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    return run_script("train_nmt.py", argv, parse_args, check_args, lambda args: dispatch(args, argv),
                      out_dir=lambda args: None if args.benchmark or args.eval_only or args.sweep or args.translate
                      else default_out(args),
                      errors=(nmt_data.DataError,))


if __name__ == "__main__":
    sys.exit(main())
