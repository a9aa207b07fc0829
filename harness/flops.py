"""Model FLOPs and the devices' peaks: what `train_nmt.py --benchmark` and the plain-PyTorch reference
(bench/torch_reference.py) count the same way. No Keras, so the reference process loads none.

    flop = train_flops(dict(d_model=512, ffn_dim=1024, ...), sentences=128, length=32)   # one train step
    peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16")                                      # 989.0
    utilisation(tokens_per_s, flop / (128 * 32), matmul_tflops, peak)                     # MFU, bound fraction
"""


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
    of one FFN-sized matrix product (`benchmark._matmul_tflops`): 1 would be a step whose every FLOP ran as fast
    as that lone product, with all other operations free."""
    tflops = tokens_per_s * flop_per_token / 1e12
    return dict(mfu=significant(tflops / peak) if peak else None,
                matmul_bound_fraction=significant(tflops / matmul_tflops) if matmul_tflops else None)


def significant(value, digits=4):
    """`value` to `digits` significant digits: the tiny rates of a test model do not round to 0."""
    return float(f"{value:.{digits}g}")
