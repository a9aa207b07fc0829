"""`train_nmt.py --benchmark`: train-step and decoding speed, memory, model FLOPs and MFU, as one JSON line.

    KERAS_BACKEND=jax python train_nmt.py --benchmark 20            # the PyTorch reference's workload
    KERAS_BACKEND=torch python train_nmt.py --benchmark 20 --precision mixed_bfloat16

The workload is bench/torch_reference.py's, so that the two print comparable lines; bench/speed_table.py
turns the lines into the README's speed table. The FLOP count, the peak table and `utilisation` are in
harness/flops.py, which the reference shares. The backends' own libraries are imported inside the functions
that measure (backend-specific code).
"""

import json
import resource
import time

import keras
import numpy as np
from keras import ops

from harness import devices, nmt_data
from harness.devices import compiled
from harness.flops import peak_tflops, significant, train_flops, utilisation
from harness.nmt_job import beam_search, beam_step
from models import LabelSmoothedCrossEntropy, TranslationTransformer

BENCHMARK_LENGTH = 32  # source and target tokens per sentence, as in the plain-PyTorch reference (bench/torch_reference.py)


def benchmark(args, presets):
    """Time train steps of the PyTorch reference's workload and print one JSON line (train_nmt.py --benchmark).

    The workload: transformer_iwslt_de_en size (512 / 1024 / 4 heads / 6 + 6, 10k shared vocabulary),
    Pre-LN, dropout 0.1 on residuals, attention probabilities and FFN activations (as torch's
    nn.Transformer applies it), label smoothing 0.1, Adam; 128 sentences x 32 random source and target
    tokens. A --preset other than the default, or model flags (--d-model, --norm, ...), change it. The
    figure to compare is `tgt_tokens_per_s`, the median over the timed steps after two warm-up steps.
    `presets` are train_nmt.py's PRESETS: the workload's model is the iwslt preset's.
    """
    devices.tune_runtime()  # before anything compiles, as each job's run does
    explicit = set(presets[args.preset]) if args.preset != "cpu" else args.given & set(presets["cpu"])
    model_args = dict(presets["iwslt"], dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, vocab_size=10000)
    model_args.update({k: getattr(args, k) for k in model_args if k in explicit})
    setup = devices.configure(args)
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
                      loss=LabelSmoothedCrossEntropy(args.label_smoothing), jit_compile=devices.compile_xla(setup))
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
                  runtime=dict(devices.RUNTIME), precision=args.precision, norm=args.norm, params=model.count_params(),
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


def _device_name():
    """The accelerator's name as its runtime reports it (e.g. "NVIDIA H100 80GB HBM3"), or "cpu"."""
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


def _matmul_tflops(rows, d, ffn, seconds=0.3):
    """The FLOP rate of one (rows x d) @ (d x ffn) product in the compute dtype, the FFN's first matrix
    product: the rate the step would reach if all of its FLOPs ran like this one. With the model FLOPs
    above it bounds the tokens/s of any implementation of the model on this device and runtime.

    Timed over as many back-to-back products as fill `seconds` (doubling from 1), after a warm-up of the
    same calls, so that the one wait for the device at the end (a reduction read back) and the calls'
    dispatch are a small share. Timed over 5 products, a GPU's rate came out at 70.5 TFLOP/s under jax
    against 524 under torch, and a step seemed faster than its bound (a fraction of 2.26)."""
    dtype = keras.config.dtype_policy().compute_dtype
    rng = np.random.default_rng(0)
    a = ops.convert_to_tensor(rng.standard_normal((rows, d)).astype("float32"), dtype)
    b = ops.convert_to_tensor(rng.standard_normal((d, ffn)).astype("float32"), dtype)

    def timed(repeats):
        started = time.perf_counter()
        for _ in range(repeats):
            c = ops.matmul(a, b)
        ops.convert_to_numpy(ops.cast(ops.sum(c[:1]), "float32"))  # waits for the device
        return time.perf_counter() - started

    timed(2)  # compiles (jax) and warms each call timed below
    repeats = 1
    while (elapsed := timed(repeats)) < seconds:
        repeats *= 2
    return 2 * rows * d * ffn * repeats / elapsed / 1e12
