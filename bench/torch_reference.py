"""The plain-PyTorch reference train step that `train_nmt.py --benchmark` is compared against.

The workload (the same as `benchmark.benchmark`'s; results/speed/README.md):
  - an encoder-decoder Transformer of fairseq's `transformer_iwslt_de_en` size: d 512, FFN 1024 (ReLU),
    4 heads, 6 + 6 layers, Pre-LN (torch's nn.Transformer with norm_first=True, and its final
    LayerNorms), one 10,000-token embedding shared by encoder, decoder and the output projection,
    scaled by sqrt(d), sinusoidal positions;
  - dropout 0.1 on the embeddings, residual branches, attention probabilities and FFN activations;
  - label-smoothed cross-entropy (0.1) over all target tokens, Adam (lr 5e-4, betas 0.9 and 0.98);
  - one batch of SENTENCES x LENGTH random source tokens and SENTENCES x (LENGTH + 1) target tokens
    (decoder input and output shifted by one), 128 x 32 by default, the same batch every step.
The figure to compare is `tgt_tokens_per_s`: SENTENCES x LENGTH over the median step time of the
timed steps, after warm-up steps. Each step is timed between torch.cuda.synchronize() calls on a GPU.

--dtype bfloat16 runs the forward pass and the loss under torch.autocast on the device (float32 master
weights and Adam state, products in bfloat16): the counterpart of Keras's mixed_bfloat16 policy.
--compile wraps the whole step (forward, backward, Adam) in torch.compile.

The JSON line also gives the model FLOPs per target token (`flops.train_flops`: the count the
Keras benchmark reports), the FLOP rate they make, the rate of one FFN-sized matrix product alone in
the same dtype (`matmul_tflops_per_s`), the fraction of it the step reaches (`matmul_bound_fraction`)
and MFU against the device's peak (--peak-tflops, else `flops.PEAK_TFLOPS`; none on a CPU).

usage: python bench/torch_reference.py [--dtype float32|bfloat16] [--compile] [--device cpu|cuda]
           [--d-model 512] [--ffn-dim 1024] [--heads 4] [--layers 6] [--vocab 10000] [--sentences 128]
           [--length 32] [--warmup 2] [--steps 10] [--peak-tflops T]
Needs torch (any recent CPU or CUDA build); Keras is not imported.
"""

import json
import math
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness.console import OneLineParser  # noqa: E402
# harness/flops.py imports no Keras
from harness.flops import peak_tflops, significant, train_flops, utilisation  # noqa: E402

PROG = "bench/torch_reference.py"


def sinusoids(length, dim):
    """Sinusoidal positions (Vaswani et al. 2017, Section 3.5): sines then cosines, as fairseq lays them out."""
    import torch

    position = np.arange(length)[:, None]
    rate = 1.0 / np.power(10000, 2 * np.arange(dim // 2)[None] / dim)
    table = np.concatenate([np.sin(position * rate), np.cos(position * rate)], axis=-1)
    return torch.tensor(table, dtype=torch.float32)


def build_model(a):
    import torch
    import torch.nn as nn

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.dim = a.d_model
            self.embedding = nn.Embedding(a.vocab, a.d_model)
            nn.init.normal_(self.embedding.weight, std=a.d_model ** -0.5)
            self.transformer = nn.Transformer(a.d_model, a.heads, a.layers, a.layers, a.ffn_dim, 0.1,
                                              batch_first=True, norm_first=True)
            self.dropout = nn.Dropout(0.1)
            self.register_buffer("positions", sinusoids(max(1024, a.length + 1), a.d_model))
            self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(a.length))

        def embed(self, tokens):
            scaled = self.embedding(tokens) * math.sqrt(self.dim)
            return self.dropout(scaled + self.positions[: tokens.shape[1]])

        def forward(self, source, target_in):
            hidden = self.transformer(self.embed(source), self.embed(target_in),
                                      tgt_mask=self.causal, tgt_is_causal=True)
            return hidden @ self.embedding.weight.T  # the tied output projection

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="enable_nested_tensor is True")  # Pre-LN has no nested-tensor path
        return Seq2Seq()


def matmul_tflops(rows, d, ffn, device, dtype, seconds=0.3):
    """The FLOP rate of one (rows x d) @ (d x ffn) product in the step's compute dtype: the FFN's first
    product, as `benchmark._matmul_tflops` measures it in each Keras backend (back-to-back products
    filling `seconds`, doubling from 1, after a warm-up)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(rows, d, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(d, ffn, generator=generator).to(device=device, dtype=dtype)

    def timed(repeats):
        started = time.perf_counter()
        for _ in range(repeats):
            c = a @ b
        c[:1].sum().item()  # waits for the device
        synchronize(device)
        return time.perf_counter() - started

    timed(2)
    repeats = 1
    while (elapsed := timed(repeats)) < seconds:
        repeats *= 2
    return 2 * rows * d * ffn * repeats / elapsed / 1e12


def synchronize(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_parser():
    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="float32, or bfloat16 under torch.autocast with float32 weights (Keras's mixed_bfloat16)")
    p.add_argument("--compile", action="store_true", help="torch.compile the whole train step")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if available, else cpu")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--ffn-dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=6, help="encoder layers and decoder layers (6 + 6)")
    p.add_argument("--vocab", type=int, default=10000)
    p.add_argument("--sentences", type=int, default=128)
    p.add_argument("--length", type=int, default=32, help="source and target tokens per sentence")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (compiling, with --compile)")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--peak-tflops", type=float, metavar="TFLOPS",
                   help="the device's peak TFLOP/s in the products' arithmetic, for MFU; default: "
                   "flops.PEAK_TFLOPS (H100, H200), none on a CPU")
    return p


def check(p, a):
    for name in ("d_model", "ffn_dim", "heads", "layers", "vocab", "sentences", "length", "steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive number, got {getattr(a, name)}")
    if a.warmup < 0:
        p.error(f"--warmup must be 0 or more steps, got {a.warmup}")
    if a.compile and a.warmup < 1:
        p.error("--compile needs --warmup 1 or more: the first step compiles, and must not be timed")
    if a.d_model % a.heads:
        p.error(f"--d-model {a.d_model} is not a multiple of --heads {a.heads}; choose a divisor")
    if a.peak_tflops is not None and not a.peak_tflops > 0:
        p.error(f"--peak-tflops must be a positive number of TFLOP/s, got {a.peak_tflops}")


def check_torch(p, a):
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this torch build sees no CUDA device; use --device cpu")
    if a.compile and not hasattr(torch, "compile"):
        p.error(f"--compile: torch {torch.__version__} has no torch.compile; use torch 2 or later, or leave it out")


def main(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    check(p, a)
    try:
        import torch
    except ImportError as error:
        p.exit(2, f"{PROG}: error: cannot import torch ({error}); pip install torch\n")
    check_torch(p, a)
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = build_model(a).to(device).train()
    step = train_step(model, a, device)
    warmup_s = warm_up(p, a, step)
    times = []
    for _ in range(a.steps):
        synchronize(device)
        started = time.perf_counter()
        step().item()
        synchronize(device)
        times.append(time.perf_counter() - started)
    print(json.dumps(report(a, model, device, warmup_s, float(np.median(times)))), flush=True)
    return 0


def train_step(model, a, device):
    """The train step on the workload's one batch: forward, label-smoothed loss, backward and Adam, in
    bfloat16 under autocast with --dtype bfloat16, compiled with --compile. Returns the loss."""
    import torch
    import torch.nn as nn

    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4, betas=(0.9, 0.98), eps=1e-8)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    rng = np.random.default_rng(0)
    source = torch.tensor(rng.integers(4, a.vocab, (a.sentences, a.length)), device=device)
    target = torch.tensor(rng.integers(4, a.vocab, (a.sentences, a.length + 1)), device=device)

    def step():
        optimizer.zero_grad(set_to_none=True)
        # bfloat16: products in bfloat16 under autocast; autocast keeps the softmax, LayerNorm and the loss
        # in float32 and the gradients reach float32 weights, as Keras's mixed_bfloat16 policy does.
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.dtype == "bfloat16"):
            logits = model(source, target[:, :-1])
            loss = loss_fn(logits.reshape(-1, a.vocab).float(), target[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        return loss.detach()

    return torch.compile(step) if a.compile else step


def warm_up(p, a, step):
    """Seconds of the --warmup untimed steps; one line and exit code 2 when --compile fails on this machine."""
    started = time.perf_counter()
    try:
        for _ in range(a.warmup):
            step().item()
    except Exception as error:  # torch.compile needs a working compiler toolchain (Inductor: a C++ compiler or Triton)
        if not a.compile:
            raise
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        p.exit(2, f"{PROG}: error: --compile failed on this machine ({type(error).__name__}: {first[:200]}); "
                  "leave --compile out\n")
    return time.perf_counter() - started


def report(a, model, device, warmup_s, median):
    """The JSON line's fields: the settings, the median step time `median` and the target tokens a second it
    gives, the model FLOP rate, the matrix-product rate measured now and MFU against the device's peak."""
    import torch

    tokens = a.sentences * a.length
    model_args = dict(d_model=a.d_model, ffn_dim=a.ffn_dim, vocab_size=a.vocab, encoder_layers=a.layers,
                      decoder_layers=a.layers)
    flops = train_flops(model_args, a.sentences, a.length)
    matmul = matmul_tflops(tokens, a.d_model, a.ffn_dim, device, getattr(torch, a.dtype))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    arithmetic = a.dtype if a.dtype != "float32" or not torch.backends.cuda.matmul.allow_tf32 else "tf32"
    peak, basis = a.peak_tflops, "--peak-tflops" if a.peak_tflops else None
    if not peak and device.type == "cuda":
        peak = peak_tflops(name, arithmetic)
        basis = f"{name}, dense {arithmetic}" if peak else None
    return {
        "system": "plain-pytorch", "torch": torch.__version__, "device": device.type, "device_name": name,
        "threads": torch.get_num_threads(), "dtype": a.dtype, "compile": a.compile,
        "params": sum(p.numel() for p in model.parameters()),
        "d_model": a.d_model, "ffn_dim": a.ffn_dim, "heads": a.heads, "layers": a.layers, "vocab": a.vocab,
        "sentences": a.sentences, "length": a.length, "warmup": a.warmup, "steps": a.steps,
        "warmup_s": round(warmup_s, 3), "step_s": round(median, 5), "median_step_s": round(median, 5),
        "tgt_tokens_per_s": round(tokens / median, 1), "flop_per_tgt_token": flops // tokens,
        "model_tflops_per_s": significant(flops / median / 1e12), "matmul_tflops_per_s": significant(matmul),
        "matmul_bound_tokens_per_s": round(tokens * matmul * 1e12 / flops, 1),
        "peak_tflops": peak, "peak_basis": basis, **utilisation(tokens / median, flops / tokens, matmul, peak),
    }


if __name__ == "__main__":
    sys.exit(main())
