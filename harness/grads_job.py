"""The analyses' Keras side: what analyze_grads.py's `analyze` calls, gradients and hidden-state norms at
initialization.

    result = run_fig3_layers(spec.model, spec.data, spec.part("loss"), out, norms, layers, batches, seed)
    rows = summary_rows({"fig3-layers": result, ...})   # claim, measured, theory, agrees?

Each analysis (`run_fig3_layers`, ...) takes the parts of a `specs.AnalysisSpec` it uses, the model part
`architecture`, data part `data` and loss part `objective`, the output folder `out` and its own settings as
plain values (the placements, depths, seeds). analyze_grads.py imports this module once run_script has
checked KERAS_BACKEND. The figures are drawn by harness/plots.py.
"""

import functools

import keras
import numpy as np

from harness import nmt_data
from harness.console import UsageError
from harness.devices import loss_and_gradients
from harness.plots import plot_deepnet, plot_fig3_depth, plot_fig3_layers, plot_lemma2, save_figure
from harness.rundir import RunDir, code_version
from harness.specs import QKV_INITS
from layers import TransformerEncoderBlock, padding_mask
from models import BertMaskedLM, LabelSmoothedCrossEntropy, TranslationTransformer
from schedules import make_schedule

THEORY_QKV_GAIN = QKV_INITS["theory"]

# --- data -----------------------------------------------------------------------------------------

def load_batches(data, out, count, seed=0):
    """`count` batches of shape (rows, length), as the spec's data part `data` says: real sentences (--corpus
    or --data-dir, their vocabulary learned in OUT/vocab) or random ids."""
    length, rows = data.length, max(1, data.max_tokens // data.length)
    if data.random_tokens:
        rng = np.random.default_rng(seed)
        batches = []
        for _ in range(count):
            lengths = rng.integers(length // 2, length + 1, size=(2, rows))
            src, tgt = (rng.integers(3, data.vocab_size, (rows, length)) for _ in range(2))
            src[np.arange(length)[None] >= lengths[0][:, None]] = nmt_data.PAD
            tgt[np.arange(length)[None] >= lengths[1][:, None]] = nmt_data.PAD
            decoder_in = np.concatenate([np.full((rows, 1), nmt_data.EOS), tgt[:, :-1]], axis=1)
            batches.append(({"source_ids": src, "decoder_input_ids": decoder_in}, tgt))
        return batches, data.vocab_size, "random token ids"
    examples, vocab_size, data_name = encoded_sentences(data.data_dir, data.src, data.tgt, data.corpus,
                                                        data.vocab_size, RunDir(out).vocab, length)
    batches = nmt_data.make_batches(examples, data.max_tokens, seed=seed, buckets=(length,))
    return (batches * count)[:count], vocab_size, data_name


@functools.lru_cache(maxsize=None)
def encoded_sentences(data_dir, src, tgt, corpus, vocab_size, vocab_dir, length):
    """(training pairs encoded and cut to `length`, vocabulary size, the corpus's description), read and
    encoded once for all the analyses of a process."""
    corpus = nmt_data.load_corpus(data_dir, src, tgt, corpus=corpus)
    vocab = nmt_data.build_vocabulary(corpus.splits["train"], vocab_size, vocab_dir, corpus.bpe_split)
    examples = nmt_data.encode_pairs(corpus.splits["train"], vocab, max_length=length)
    if not examples:
        raise UsageError(f"no training pair of {corpus.name} fits in --length {length}; raise --length")
    return examples, vocab.size, corpus.description


def make_loss(settings, pad_id=0):
    """The loss whose gradients are measured, as the spec's loss part `settings` says (--loss,
    --label-smoothing)."""
    return LabelSmoothedCrossEntropy(settings.label_smoothing if settings.loss == "label_smoothed" else 0.0,
                                     pad_id=pad_id)


def translation_model(settings, norm, layers, vocab_size, seed):
    """A TranslationTransformer of the spec's model part `settings` with `layers` blocks per stack, placement
    `norm`, no dropout, drawn from `seed`."""
    keras.utils.set_random_seed(seed)
    # The theorems assume Xavier with gain 1 on every matrix (Xiong et al., Section 3.3), not the toolkits'
    # 1/sqrt(2) on W^Q, W^K, W^V that training uses.
    model = TranslationTransformer(vocab_size, d_model=settings.d_model, ffn_dim=settings.ffn_dim,
                                   num_heads=settings.heads,
                                   encoder_layers=layers, decoder_layers=layers, norm=norm, dropout=0.0,
                                   qkv_gain=THEORY_QKV_GAIN)
    model.build()
    return model


def expected_gradients(model, loss, batches):
    """Entry-wise mean of the gradients over the batches, as {variable path: array}."""
    total = None
    for inputs, labels in batches:
        _, grads = loss_and_gradients(model, loss, inputs, labels)
        total = grads if total is None else [t + g for t, g in zip(total, grads)]
    return {v.path: g / len(batches) for v, g in zip(model.trainable_variables, total)}


def ffn_gradient_norms(model, grads):
    """[(stack, layer 1.., matrix, ||E grad||_F)] for W1 and W2 of every encoder and decoder layer."""
    rows = []
    for stack, blocks in (("encoder", model.encoder_blocks), ("decoder", model.decoder_blocks)):
        for i, block in enumerate(blocks, start=1):
            for matrix in ("w1", "w2"):
                kernel = getattr(block.feed_forward, matrix).kernel
                rows.append((stack, i, matrix.upper(), float(np.linalg.norm(grads[kernel.path]))))
    return rows


# --- the analyses ---------------------------------------------------------------------------------

def run_fig3_layers(architecture, data, objective, out, norms, layers, batches, seed, tag="fig3-layers", models=None):
    """Figure 3(a, b): the expected gradient of each FFN matrix, layer by layer, of each placement in `norms`
    (a model of `layers` blocks per stack drawn from `seed`, or the given `models`), over `batches` batches."""
    batches, vocab_size, description = load_batches(data, out, batches)
    loss, rows = make_loss(objective), []
    for norm in norms:
        model = models[norm] if models else translation_model(architecture, norm, layers, vocab_size, seed)
        grads = expected_gradients(model, loss, batches)
        rows += [dict(norm=norm, stack=s, layer=i, matrix=m, grad_norm=g) for s, i, m, g in ffn_gradient_norms(model, grads)]
    growth = {}
    for norm in norms:  # decoder W2: last layer / first layer (the paper's plot rises for Post-LN)
        w2 = {r["layer"]: r["grad_norm"] for r in rows if r["norm"] == norm and r["stack"] == "decoder" and r["matrix"] == "W2"}
        growth[norm] = w2[max(w2)] / w2[min(w2)]
    result = dict(data=description, batches=len(batches), rows=rows, decoder_w2_last_over_first=growth)
    write_outputs(out, tag, rows, result, plot_fig3_layers)
    return result


def run_fig3_depth(architecture, data, objective, out, depths, seeds, batches, first_seed):
    """Figure 3(c, d) / Theorem 1: the last FFN's W^2 gradient against depth (`depths`), `seeds` models from
    `first_seed` on, over `batches` batches."""
    batches, vocab_size, description = load_batches(data, out, batches)
    loss, rows = make_loss(objective), []
    for norm in ("post", "pre"):
        for depth in depths:
            for seed in range(seeds):
                model = translation_model(architecture, norm, depth, vocab_size, first_seed + seed)
                grads = expected_gradients(model, loss, batches)
                kernel = model.decoder_blocks[-1].feed_forward.w2.kernel
                rows.append(dict(norm=norm, layers=depth, seed=seed, grad_norm=float(np.linalg.norm(grads[kernel.path]))))
    slopes, summary = {}, []
    for norm in ("post", "pre"):
        means = [np.mean([r["grad_norm"] for r in rows if r["norm"] == norm and r["layers"] == d]) for d in depths]
        stds = [np.std([r["grad_norm"] for r in rows if r["norm"] == norm and r["layers"] == d]) for d in depths]
        slopes[norm] = float(np.polyfit(np.log(depths), np.log(means), 1)[0]) if len(depths) > 1 else 0.0
        summary += [dict(norm=norm, layers=d, mean=m, std=s) for d, m, s in zip(depths, means, stds)]
    result = dict(data=description, rows=rows, summary=summary, loglog_slope=slopes,
                  theory_slope=dict(post=0.0, pre=-0.5),
                  finite_depth_slope=dict(post=[0.0, 0.0], pre=finite_depth_slopes(depths)))
    write_outputs(out, "fig3-depth", rows, result, plot_fig3_depth)
    return result


def finite_depth_slopes(depths):
    """Theorem 1 at the depths measured (results/protocols.md, 2026-11-29, 7): Pre-LN's last-layer gradient
    scales as 1 / sqrt(E||x_L||^2), and Lemma 2 bounds E||x_L||^2 between (1 + L/2) d and (1 + 3L/2) d, so
    over `depths` its log-log slope lies between those of (1 + c L)^(-1/2) for c = 3/2 and c = 1/2 (fitted as
    the measurement is): [lower, upper], -0.42 and -0.33 over depths 2-8, -1/2 only as L grows without bound."""
    depths = np.asarray(depths, dtype=float)
    return sorted(float(np.polyfit(np.log(depths), -0.5 * np.log(1 + c * depths), 1)[0]) if len(depths) > 1 else -0.5
                  for c in (0.5, 1.5))  # one depth has no slope: the limit's


def hidden_state_norms(blocks, norm, x, mask):
    """Per layer l = 1..L: E||x||^2 / d of Post-LN's x^{post,5} (x3 + x4, before the block's last LN)
    or Pre-LN's x^{pre} after l layers (index 0 = the input). Replays each block's sub-layers."""
    d = x.shape[-1]
    valid = np.broadcast_to(np.asarray(mask)[:, 0, :, None], x.shape[:2] + (1,))[..., 0]

    def mean_sq(v):
        v = np.asarray(keras_to_numpy(v))
        return float((v**2).sum(-1)[valid].mean() / d)

    values = [mean_sq(x)] if norm == "pre" else []
    for block in blocks:
        attn = block.self_attention_residual
        x3 = attn(x, block.self_attention(attn.branch_input(x), attention_mask=mask))
        ffn = block.feed_forward_residual
        x4 = block.feed_forward(ffn.branch_input(x3))
        if norm == "post":
            values.append(mean_sq(x3 + x4))
        x = ffn(x3, x4)
        if norm == "pre":
            values.append(mean_sq(x))
    return values


def keras_to_numpy(v):
    return keras.ops.convert_to_numpy(v)


def run_lemma2(architecture, data, out, layers, seeds, first_seed, simplified):
    """Lemma 2: E||x||^2 / d layer by layer in a stack of `layers` blocks, averaged over `seeds` draws from
    `first_seed` on; `simplified`: the paper's simplified setting, else the translation encoder on real
    batches."""
    # E||FFN(LN x)||^2 / d at Xavier init: (1/2) ffn (2 / (d + ffn)) d (2 / (d + ffn)) = 1/2 when ffn = d.
    d = architecture.d_model
    ffn = d if simplified else architecture.ffn_dim
    c_ffn = 2 * d * ffn / (d + ffn) ** 2
    rows, sums = [], {}
    for seed in range(seeds):
        keras.utils.set_random_seed(first_seed + seed)
        if simplified:  # one head, W^Q = W^K = 0 (uniform attention), all matrices d x d, Gaussian input
            rng = np.random.default_rng(first_seed + seed)
            x = rng.standard_normal((data.max_tokens // data.length, data.length, d)).astype("float32")
            mask = np.ones((x.shape[0], 1, x.shape[1]), bool)
            stacks = {}
            for norm in ("post", "pre"):
                blocks = [TransformerEncoderBlock(d, 1, d, norm=norm, dropout=0.0) for _ in range(layers)]
                for block in blocks:
                    block.build(x.shape)
                    for dense in (block.self_attention.query_dense, block.self_attention.key_dense):
                        dense.kernel.assign(np.zeros(dense.kernel.shape, "float32"))
                stacks[norm] = blocks
            inputs = {"post": x, "pre": x}
        else:  # the real translation encoder: embeddings of real sentences, positions, padding
            batches, vocab_size, _ = load_batches(data, out, 1, seed=seed)
            batch = batches[0][0]
            models = {n: translation_model(architecture, n, layers, vocab_size, first_seed + seed)
                      for n in ("post", "pre")}
            mask = np.asarray(keras_to_numpy(padding_mask(batch["source_ids"])))
            stacks = {n: m.encoder_blocks for n, m in models.items()}
            inputs = {n: m.embedding(batch["source_ids"]) for n, m in models.items()}
        for norm in ("post", "pre"):
            values = hidden_state_norms(stacks[norm], norm, inputs[norm], mask)
            sums.setdefault(norm, []).append(values)
    for norm in ("post", "pre"):
        mean = np.mean(sums[norm], axis=0)
        if norm == "post":
            for l, v in enumerate(mean, start=1):
                rows.append(dict(norm=norm, layer=l, measured=float(v), theory=1 + c_ffn, lower="", upper=""))
        else:
            x0 = float(mean[0])  # the input's own scale (1 in the simplified setting)
            for l, v in enumerate(mean):
                rows.append(dict(norm=norm, layer=l, measured=float(v), theory="", lower=x0 + c_ffn * l,
                                 upper=x0 + (1 + c_ffn) * l))
    post = [r["measured"] for r in rows if r["norm"] == "post"]
    pre_inside = all(r["lower"] * 0.95 <= r["measured"] <= r["upper"] * 1.05 for r in rows if r["norm"] == "pre")
    result = dict(simplified=simplified, rows=rows, post_mean=float(np.mean(post)), post_theory=1 + c_ffn,
                  pre_inside_bounds=pre_inside, ffn_term=c_ffn)
    write_outputs(out, "lemma2" + ("-simplified" if simplified else ""), rows, result, plot_lemma2)
    return result


def run_after_warmup(architecture, data, objective, out, layers, batches, steps, lr, seed):
    """Train Post-LN (`layers` blocks per stack, drawn from `seed`) with linear warmup to `lr` for `steps`
    updates, then redo Figure 3(a) over `batches` batches."""
    _, vocab_size, _ = load_batches(data, out, batches)
    train, _, _ = load_batches(data, out, steps, seed=seed + 1)
    model = translation_model(architecture, "post", layers, vocab_size, seed)
    measure = functools.partial(run_fig3_layers, architecture, data, objective, out, ("post",), layers, batches, seed,
                                models={"post": model})
    before = measure("after-warmup-init")
    schedule = make_schedule("inverse_sqrt", lr, steps, None)  # it trains the warmup alone
    model.compile(optimizer=keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98), loss=make_loss(objective))
    losses = []
    for inputs, labels in train:
        losses.append(float(keras_to_numpy(model.train_on_batch(inputs, labels))))
    after = measure("after-warmup")
    mean = lambda rows: float(np.mean([r["grad_norm"] for r in rows]))  # noqa: E731
    result = dict(steps=steps, lr=lr, first_loss=losses[0], last_loss=losses[-1],
                  mean_grad_norm_at_init=mean(before["rows"]), mean_grad_norm_after=mean(after["rows"]))
    result["ratio"] = result["mean_grad_norm_after"] / result["mean_grad_norm_at_init"]
    RunDir(out).write_json("after-warmup-summary.json", dict(result, code_version=code_version()))
    return result


def run_deepnet(architecture, data, objective, out, depths, lr, seed):
    """Relative model update of an encoder-only stack (masked LM) after one SGD and one Adam step of size `lr`,
    at each of `depths`, the models drawn from `seed`."""
    batches, vocab_size, description = load_batches(data, out, 1)
    inputs, _ = batches[0]
    tokens = np.asarray(inputs["source_ids"])
    rng = np.random.default_rng(seed)
    masked = (rng.random(tokens.shape) < 0.15) & (tokens != 0)
    corrupted = np.where(masked, 2, tokens)  # the unknown id stands in for [MASK]
    labels = np.where(masked, tokens, 0)
    loss = make_loss(objective)
    configs = [("post", "paper"), ("pre", "paper"), ("deepnorm", "paper"), ("deepnorm", "sgd"), ("deepnorm", "adam")]
    rows = []
    for depth in depths:
        for norm, rule in configs:
            keras.utils.set_random_seed(seed)
            # DeepNet's analysis is of its Xavier init (gain 1 on W^Q, W^K; beta on W^V, W^O, W^1, W^2), not of
            # BERT's std 0.02.
            model = BertMaskedLM(vocab_size, num_layers=depth, d_model=architecture.d_model,
                                 num_heads=architecture.heads, ffn_dim=architecture.ffn_dim,
                                 max_positions=max(512, data.length), norm=norm,
                                 deepnorm_rule=rule, dropout=0.0, attention_dropout=0.0, activation="gelu",
                                 initializer="xavier", layer_norm_epsilon=1e-5, qkv_gain=THEORY_QKV_GAIN)
            batch = {"token_ids": corrupted}
            model(batch)
            theta = [np.asarray(keras_to_numpy(v), "float64") for v in model.trainable_variables]
            features = np.asarray(keras_to_numpy(model.encode(corrupted)))
            _, grads = loss_and_gradients(model, lambda y, out: loss(y, out["mlm_logits"]), batch, labels)
            for optimizer in ("sgd", "adam"):
                # One step from theta: SGD theta - lr g; Adam's first step theta - lr g / (|g| + eps).
                step = [g if optimizer == "sgd" else g / (np.abs(g) + 1e-8) for g in grads]
                for v, t, s in zip(model.trainable_variables, theta, step):
                    v.assign((t - lr * s).astype("float32"))
                moved = np.asarray(keras_to_numpy(model.encode(corrupted)))
                real = tokens != 0
                delta = float(np.linalg.norm((moved - features)[real]) / np.linalg.norm(features[real]))
                rows.append(dict(layers=depth, norm=norm, rule=rule if norm == "deepnorm" else "",
                                 optimizer=optimizer, relative_update=delta))
                for v, t in zip(model.trainable_variables, theta):
                    v.assign(t.astype("float32"))
    growth = {}
    for norm, rule in configs:
        for optimizer in ("sgd", "adam"):
            values = [r["relative_update"] for r in rows if r["norm"] == norm and r["optimizer"] == optimizer
                      and r["rule"] == (rule if norm == "deepnorm" else "")]
            growth[f"{norm}{'-' + rule if norm == 'deepnorm' else ''}/{optimizer}"] = values[-1] / values[0]
    result = dict(data=description, lr=lr, rows=rows, growth_last_over_first_depth=growth)
    write_outputs(out, "deepnet-update", rows, result, plot_deepnet)
    return result


# Tolerances for "yes": a log-log slope within SLOPE_TOLERANCE of the theory's, a norm within
# NORM_TOLERANCE (relative). Otherwise "in direction" when the sign of the effect is right, else "NO".
SLOPE_TOLERANCE, NORM_TOLERANCE = 0.1, 0.05


def _verdict(agrees, in_direction):
    return "yes" if agrees else "in direction" if in_direction else "NO"


def summary_rows(results):
    """(claim, measured, theory, verdict) rows; verdict is "yes", "in direction" or "NO" (see the tolerances)."""
    rows = []
    if "fig3-layers" in results:
        g = results["fig3-layers"]["decoder_w2_last_over_first"]
        if "post" in g and "pre" in g:
            direction = g["post"] > 1 and g["post"] > g["pre"]
            rows.append(("Fig 3(a,b): Post-LN grad grows with layer index, Pre-LN flat",
                         f"decoder W2 last/first: post {g['post']:.2f}, pre {g['pre']:.2f}", "post > 1, pre ~ 1",
                         _verdict(direction and g["post"] > 1.2 and 0.5 < g["pre"] < 2, direction)))
    if "fig3-depth" in results:
        s = results["fig3-depth"]["loglog_slope"]
        finite = results["fig3-depth"]["finite_depth_slope"]  # the theory at the depths measured: [lower, upper]
        for norm in ("post", "pre"):
            lower, upper = finite[norm]
            direction = s[norm] < 0 if upper < 0 else abs(s[norm]) < 2 * SLOPE_TOLERANCE
            off = max(lower - s[norm], s[norm] - upper, 0.0)  # how far outside the theory's range
            theory = f"{lower:+.2f}" if lower == upper else f"{lower:+.2f} to {upper:+.2f}"
            rows.append((f"Fig 3(c,d)/Thm 1: {'Post' if norm == 'post' else 'Pre'}-LN last-FFN grad vs depth L "
                         "(log-log slope)", f"{s[norm]:+.2f}", theory, _verdict(off <= SLOPE_TOLERANCE, direction)))
    for key in ("lemma2", "lemma2-simplified"):
        if key in results:
            r = results[key]
            ratio = r["post_mean"] / r["post_theory"]
            rows.append((f"Lemma 2{' (simplified)' if r['simplified'] else ''}: Post-LN E||x5||^2/d",
                         f"{r['post_mean']:.3f}", f"{r['post_theory']:.3f}",
                         _verdict(abs(ratio - 1) <= NORM_TOLERANCE, abs(ratio - 1) < 0.5)))
            rows.append((f"Lemma 2{' (simplified)' if r['simplified'] else ''}: Pre-LN E||x_l||^2/d in bounds",
                         "inside" if r["pre_inside_bounds"] else "outside", "(x0 + c l, x0 + (1 + c) l)",
                         _verdict(r["pre_inside_bounds"], False)))
    if "after-warmup" in results:
        r = results["after-warmup"]
        rows.append((f"After {r['steps']} warmup updates Post-LN gradients are small",
                     f"mean grad norm x{r['ratio']:.2f} of init", "< 1", _verdict(r["ratio"] < 1, False)))
    if "deepnet" in results:
        g = results["deepnet"]["growth_last_over_first_depth"]
        post, deepnorm = g["post/adam"], g["deepnorm-paper/adam"]
        rows.append(("DeepNet: Adam-step ||dF|| grows with depth for Post-LN, bounded for DeepNorm",
                     f"growth post {post:.2f}, deepnorm {deepnorm:.2f}", "post grows, deepnorm bounded",
                     _verdict(post > 1 + NORM_TOLERANCE >= deepnorm, post > deepnorm)))
    return rows


def print_summary(rows, out):
    widths = [max(len(str(r[i])) for r in rows + [("claim", "measured", "theory", "agrees")]) for i in range(3)]
    lines = [f"{'claim':<{widths[0]}}  {'measured':<{widths[1]}}  {'theory':<{widths[2]}}  agrees"]
    for claim, measured, theory, agrees in rows:
        lines.append(f"{claim:<{widths[0]}}  {measured:<{widths[1]}}  {theory:<{widths[2]}}  {agrees}")
    print("\n".join(lines))
    version = code_version()
    RunDir(out).write_json("summary.json", [dict(claim=c, measured=m, theory=t, agrees=a, code_version=version)
                                                   for c, m, t, a in rows])


def write_outputs(out, name, rows, result, plot):
    """NAME.csv (the rows), NAME.json (the result) and NAME.png (`plot(rows, result)`) in the folder `out`."""
    run_dir = RunDir(out)
    run_dir.write_csv(f"{name}.csv", rows)
    run_dir.write_json(f"{name}.json", dict(result, code_version=code_version()))
    save_figure(plot(rows, result), run_dir.file(f"{name}.png"), dpi=110)
