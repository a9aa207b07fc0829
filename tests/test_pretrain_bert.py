"""pretrain_bert.py and harness/bert_data.py: masking, the document split, packing, pretraining end to end, resume,
the Figure 5 sweep, GLUE fine-tuning, and bad input."""

import json
import os
import random

import keras
import numpy as np
import pytest
from conftest import to_numpy

import pretrain_bert
from harness import bert_data, bert_job, glue, rundir
from reproduction import sweeps
from harness.devices import lr_at
from harness.files import read_csv
from optimizers import bert_optimizer, exclude_from_decay
from schedules import make_schedule

MRPC_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "glue", "MRPC")
WORDS = dict(
    noun="cat dog river teacher garden window city letter painter mountain engine village".split(),
    verb="sees finds paints follows builds crosses remembers carries".split(),
    adjective="small old quiet bright distant careful heavy green".split(),
)


def sentence(rng):
    pick = lambda kind: rng.choice(WORDS[kind])  # noqa: E731
    return f"The {pick('adjective')} {pick('noun')} {pick('verb')} the {pick('noun')} near the {pick('noun')}."


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """30 documents of 6 generated sentences in BERT's format (a blank line between documents)."""
    rng = random.Random(5)
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join("\n".join(sentence(rng) for _ in range(6)) for _ in range(30)) + "\n")
    return path


def pretrain(corpus, out, *extra):
    return pretrain_bert.main(["--preset", "tiny", "--corpus", str(corpus), "--out", str(out), *extra])


@pytest.fixture(scope="module")
def fig5(corpus, tmp_path_factory):
    """`--sweep fig5` at the tiny preset with next-sentence pairs: both recipes, 4 updates each,
    checkpoints at updates 2 and 4."""
    out = tmp_path_factory.mktemp("runs") / "fig5"
    assert pretrain(corpus, out, "--sweep", "fig5", "--nsp") == 0
    return out


@pytest.fixture(scope="module")
def pretrained(fig5):
    """The Pre-LN run of the sweep."""
    return fig5 / "pre-no-warmup"


# --- data ------------------------------------------------------------------------------------------

def test_masking_follows_bert():
    """15 % of the word pieces are predicted: 80 % [MASK], 10 % a random piece, 10 % unchanged."""
    rng = np.random.default_rng(0)
    vocab, length, slots = 500, 128, bert_data.max_predictions(128)
    tokens = rng.integers(bert_data.FIRST_WORD_ID, vocab, (2000, length)).astype("int32")
    lengths = rng.integers(20, length - 1, 2000)
    for row, n in enumerate(lengths):  # [CLS] words [SEP] [PAD]...
        tokens[row, 0], tokens[row, n], tokens[row, n + 1:] = bert_data.CLS, bert_data.SEP, bert_data.PAD
    corrupted, positions, labels, weights = bert_data.mask_tokens(tokens, np.random.default_rng(1), vocab, slots)
    assert slots == 20 and positions.shape == labels.shape == weights.shape == (2000, 20)
    used = weights > 0
    np.testing.assert_array_equal(used.sum(1), np.minimum(20, np.round(0.15 * (lengths - 1))))
    rows = np.nonzero(used)[0]
    chosen = positions[used]
    assert (tokens[rows, chosen] >= bert_data.FIRST_WORD_ID).all()  # never [CLS], [SEP] or [PAD]
    np.testing.assert_array_equal(labels[used], tokens[rows, chosen])
    assert (labels[~used] == bert_data.PAD).all()
    assert len({(r, p) for r, p in zip(rows, chosen)}) == used.sum()  # distinct positions
    new = corrupted[rows, chosen]
    masked, unchanged = np.mean(new == bert_data.MASK), np.mean(new == labels[used])
    randomised = 1 - masked - unchanged
    assert abs(masked - 0.8) < 0.015 and abs(unchanged - 0.1) < 0.01 and abs(randomised - 0.1) < 0.01
    untouched = np.ones_like(tokens, bool)
    untouched[rows, chosen] = False
    np.testing.assert_array_equal(corrupted[untouched], tokens[untouched])
    again = bert_data.mask_tokens(tokens, np.random.default_rng(1), vocab, slots)
    np.testing.assert_array_equal(again[0], corrupted)  # seeded: the same masking


def test_random_replacements_come_from_the_whole_vocabulary():
    """The 10 % random tokens: any id but [PAD], special tokens included (create_pretraining_data.py)."""
    vocab = 12
    tokens = np.full((3000, 16), 9, "int32")  # every word piece is id 9
    tokens[:, 0], tokens[:, -1] = bert_data.CLS, bert_data.SEP
    corrupted, positions, _, weights = bert_data.mask_tokens(tokens, np.random.default_rng(2), vocab, 3)
    new = corrupted[np.nonzero(weights)[0], positions[weights > 0]]
    drawn = set(new[(new != bert_data.MASK) & (new != 9)].tolist())  # the random replacements we can see
    assert drawn == set(range(1, vocab)) - {bert_data.MASK, 9}  # [UNK], [CLS], [SEP] too; never [PAD]


def test_documents_are_split_199_to_1_and_never_shared():
    documents = [[f"document {i} sentence {j}." for j in range(3)] for i in range(1000)]
    train, valid = bert_data.split_documents(documents, seed=3, min_valid_sentences=0)
    assert len(valid) == 5 and len(train) == 995
    assert not {d[0] for d in train} & {d[0] for d in valid}
    assert sorted(map(tuple, train + valid)) == sorted(map(tuple, documents))
    assert bert_data.split_documents(documents, seed=3, min_valid_sentences=0)[1] == valid
    assert bert_data.split_documents(documents, seed=4, min_valid_sentences=0)[1] != valid
    # A small corpus holds out whole documents until validation has enough sentences (here 5 % of 3000).
    train, valid = bert_data.split_documents(documents, seed=3)
    assert sum(map(len, valid)) >= 150 and len(train) + len(valid) == 1000


def test_sequences_are_packed_from_consecutive_sentences():
    documents = [[[10 + i, 11 + i, 12 + i] for i in range(0, 30, 3)], [[50, 51], [52, 53, 54]]]
    tokens, segments, labels = bert_data.pack_sequences(documents, seq_len=10)
    assert tokens.shape == segments.shape == (6, 10) and not segments.any() and not labels.any()
    assert tokens[0].tolist() == [bert_data.CLS, 10, 11, 12, 13, 14, 15, bert_data.SEP, 0, 0]
    assert tokens[-1].tolist() == [bert_data.CLS, 50, 51, 52, 53, 54, bert_data.SEP, 0, 0, 0]
    tokens, segments, labels = bert_data.pack_sequences(documents * 20, seq_len=12, next_sentence=True, seed=1)
    assert (tokens[:, 0] == bert_data.CLS).all() and ((tokens == bert_data.SEP).sum(1) == 2).all()
    second = segments.argmax(1)  # first position of sentence B, right after the first [SEP]
    assert (tokens[np.arange(len(tokens)), second - 1] == bert_data.SEP).all()
    assert 0.3 < labels.mean() < 0.7  # about half the B sides come from another document


def test_glue_files_of_both_layouts(tmp_path):
    (tmp_path / "a.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tA man runs.\tA person moves.\tentailment\n")
    (tmp_path / "b.tsv").write_text("sentence1\tsentence2\tlabel\tidx\nIt rains.\tIt is dry.\t1\t0\n")
    assert bert_data.read_glue_tsv(str(tmp_path / "a.tsv"), "rte") == [("A man runs.", "A person moves.", 0)]
    assert bert_data.read_glue_tsv(str(tmp_path / "b.tsv"), "rte") == [("It rains.", "It is dry.", 1)]


def test_a_byte_order_mark_is_dropped_from_corpus_and_glue_files(tmp_path):
    """BERT corpus files and GLUE TSVs saved with a UTF-8 byte-order mark read the same as without."""
    text = "First sentence.\nSecond sentence.\n\nAnother document.\n"
    (tmp_path / "plain.txt").write_text(text, encoding="utf-8")
    (tmp_path / "marked.txt").write_text(text, encoding="utf-8-sig")
    marked, plain = (bert_data.read_corpus([str(tmp_path / name)]) for name in ("marked.txt", "plain.txt"))
    assert marked == plain == [["First sentence.", "Second sentence."], ["Another document."]]
    rows = "sentence1\tsentence2\tlabel\tidx\nIt rains.\tIt is dry.\t1\t0\n"
    (tmp_path / "plain.tsv").write_text(rows, encoding="utf-8")
    (tmp_path / "marked.tsv").write_text(rows.replace("\n", "\r\n"), encoding="utf-8-sig")
    assert bert_data.read_glue_tsv(str(tmp_path / "marked.tsv"), "rte") \
        == bert_data.read_glue_tsv(str(tmp_path / "plain.tsv"), "rte") == [("It rains.", "It is dry.", 1)]


@pytest.mark.skipif(not os.path.isdir(MRPC_DIR), reason="../shared/data/glue/MRPC not present")
def test_the_real_mrpc_files_parse():
    glue = bert_data.read_glue(os.path.dirname(MRPC_DIR), "mrpc")  # the GLUE folder, with MRPC/ inside
    assert len(glue["train"]) == 3668 and len(glue["dev"]) == 408
    assert {label for _, _, label in glue["train"]} == {0, 1}
    assert glue["dev"][0][0].startswith("He said the foodservice pie business")


# --- pretraining -----------------------------------------------------------------------------------

def test_recipes_and_explicit_flags():
    from schedules import LinearDecay, LinearWarmup

    post = pretrain_bert.parse_args(["--recipe", "post-warmup", "--preset", "base"])
    assert (post.norm, post.lr, post.no_warmup, post.warmup_steps) == ("post", 1e-4, False, 10000)
    schedule = make_schedule("linear", post.lr, post.warmup, post.steps)
    assert isinstance(schedule, LinearWarmup) and isinstance(schedule.after, LinearDecay)
    assert lr_at(schedule, 9999) == pytest.approx(1e-4)  # update 10,000: the peak
    assert lr_at(schedule, 4999) == pytest.approx(5e-5)
    pre = pretrain_bert.parse_args(["--recipe", "pre-no-warmup", "--lr", "2e-4", "--steps", "100"])
    assert (pre.norm, pre.lr, pre.no_warmup, pre.steps) == ("pre", 2e-4, True, 100)
    schedule = make_schedule("linear", pre.lr, pre.warmup, pre.steps)
    assert isinstance(schedule, LinearDecay) and lr_at(schedule, 0) == pytest.approx(2e-4 * 99 / 100)
    warmed = pretrain_bert.parse_args(["--recipe", "pre-no-warmup", "--warmup-steps", "7"])
    assert not warmed.no_warmup and warmed.warmup_steps == 7  # an explicit warmup wins over the recipe


@pytest.mark.parametrize("preset", sorted(pretrain_bert.PRESETS))
def test_presets_follow_devlins_bert(preset):
    """Devlin et al. 2019 (google-research/bert): Adam betas (0.9, 0.999), eps 1e-6, weight decay 0.01, clip
    norm 1.0, LayerNorm eps 1e-12, tanh GELU, truncated normal init with std 0.02; explicit flags win."""
    args = pretrain_bert.parse_args(["--preset", preset])
    assert (tuple(args.adam_betas), args.adam_epsilon, args.weight_decay, args.clip_norm) == ((0.9, 0.999), 1e-6,
                                                                                              0.01, 1.0)
    assert (args.layer_norm_epsilon, args.activation, args.initializer) == (1e-12, "gelu_tanh", "bert")
    optimizer = bert_optimizer(args, 1e-4)
    assert type(optimizer).__name__ == "AdamW"
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.999, 1e-6)
    assert (optimizer.weight_decay, optimizer.global_clipnorm) == (0.01, 1.0)
    flags = pretrain_bert.parse_args(["--preset", preset, "--adam-betas", "0.9", "0.98", "--adam-epsilon", "1e-8",
                                      "--layer-norm-epsilon", "1e-5", "--activation", "gelu", "--initializer",
                                      "xavier", "--weight-decay", "0", "--clip-norm", "0"])
    assert (tuple(flags.adam_betas), flags.adam_epsilon, flags.layer_norm_epsilon, flags.activation,
            flags.initializer, flags.weight_decay, flags.clip_norm) == ((0.9, 0.98), 1e-8, 1e-5, "gelu", "xavier", 0, 0)


def test_the_pretrained_model_is_devlins_bert():
    args = pretrain_bert.parse_args(["--preset", "tiny"])
    model = bert_job.build_model(args.model, args.data, 300)
    norms = [model.embedding.layer_norm, model.mlm_norm] + [residual.layer_norm for block in model.encoder_blocks
                                                            for residual in (block.self_attention_residual,
                                                                             block.feed_forward_residual)]
    assert all(n.epsilon == 1e-12 for n in norms)
    assert model.activation == "gelu_tanh" and all(b.feed_forward.activation == "gelu_tanh"
                                                    for b in model.encoder_blocks)
    kernels = [to_numpy(v) for v in model.trainable_variables if v.name in ("kernel", "token_embeddings")]
    assert len(kernels) == 6 * args.layers + 2  # Q, K, V, O, W1, W2 a layer, masked-LM transform, embeddings
    assert max(np.abs(k).max() for k in kernels) <= 0.04 * (1 + 1e-6)  # truncated at two std of 0.02
    assert 0.0165 < np.concatenate([k.ravel() for k in kernels]).std() < 0.0187  # 0.02 * 0.880 (truncation)


def randomized(model):
    """Every trainable weight set to a non-zero random value (biases and LayerNorm betas included)."""
    rng = np.random.default_rng(0)
    for v in model.trainable_variables:
        v.assign(rng.normal(size=v.shape).astype("float32"))
    return model


def decay_factors(model, optimizer):
    """{variable path: w_after / w_before} after one update with zero gradients: 1 - lr * weight decay if
    the variable is decayed, 1 if not (Adam, RAdam and SGD all stay put on a zero gradient)."""
    before = {v.path: to_numpy(v) for v in model.trainable_variables}
    optimizer.apply_gradients([(keras.ops.zeros(v.shape, v.dtype), v) for v in model.trainable_variables])
    return {v.path: float(np.median(to_numpy(v) / before[v.path])) for v in model.trainable_variables}


def check_decay_factors(factors, lr, weight_decay):
    for path, factor in factors.items():
        excluded = path.rsplit("/", 1)[-1] in ("gamma", "beta", "bias", "mlm_bias")
        assert factor == pytest.approx(1.0 if excluded else 1 - lr * weight_decay, abs=1e-6), path
    names = {path.rsplit("/", 1)[-1] for path in factors}
    assert {"gamma", "beta", "bias", "mlm_bias", "kernel", "token_embeddings"} <= names


@pytest.mark.parametrize("optimizer", ["adam", "radam", "sgd"])
def test_weight_decay_skips_layer_norm_and_biases(optimizer):
    """Devlin's AdamWeightDecayOptimizer(exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]):
    kernels and embeddings are decayed, LayerNorm gammas and betas and biases are not."""
    args = pretrain_bert.parse_args(["--preset", "tiny", "--optimizer", optimizer, "--weight-decay", "0.5",
                                     "--nsp"])
    model = randomized(bert_job.build_model(args.model, args.data, 50))
    check_decay_factors(decay_factors(model, bert_optimizer(args.optimization, 0.1)), 0.1, 0.5)


def test_weight_decay_exclusion_is_restored_after_loading(tmp_path):
    """Keras saves no exclusion with the optimizer: a resumed run sets it again (`exclude_from_decay`)."""
    args = pretrain_bert.parse_args(["--preset", "tiny", "--weight-decay", "0.5"])
    model = randomized(bert_job.build_model(args.model, args.data, 50))
    model.compile(optimizer=bert_optimizer(args.optimization, 0.1), loss=bert_job.pretraining_losses(args.nsp))
    model.optimizer.build(model.trainable_variables)
    path = str(tmp_path / "step1.keras")
    model.save(path)
    loaded = glue.load_bert_checkpoint(path)
    optimizer = exclude_from_decay(loaded.optimizer)
    check_decay_factors(decay_factors(loaded, optimizer), 0.1, 0.5)


def test_pretraining_end_to_end(pretrained):
    for name in ("config.json", "metrics.csv", "results.json", "curves.png", "state.json", "checkpoints/step2.keras",
                 "checkpoints/step4.keras"):
        assert (pretrained / name).is_file(), name
    results = json.loads((pretrained / "results.json").read_text())
    assert results["outcome"] == "finished" and results["updates"] == 4 and results["norm"] == "pre"
    rows = read_csv(str(pretrained / "metrics.csv"))
    assert [r["updates"] for r in rows] == ["2", "4"]
    assert all(0 < float(r["valid_loss"]) < 10 and 0 <= float(r["valid_accuracy"]) <= 1 for r in rows)
    assert all(0 <= float(r["valid_nsp_accuracy"]) <= 1 for r in rows)
    config = json.loads((pretrained / "config.json").read_text())
    assert (config["norm"], config["lr"], config["no_warmup"]) == ("pre", 3e-4, True)
    assert config["schedule"]["class_name"] == "LinearDecay" and (pretrained / config["tokenizer"]).is_file()
    assert not [p for p in os.listdir(pretrained) if ".tmp" in p or p.startswith(".partial")]


def test_resume_continues_the_same_run(corpus, pretrained, tmp_path):
    out = tmp_path / "run"
    vocab = tmp_path / "shared-vocab.json"  # a name the run would not learn: the resumed run must keep it
    vocab.write_bytes((pretrained / json.loads((pretrained / "config.json").read_text())["tokenizer"]).read_bytes())
    assert pretrain(corpus, out, "--recipe", "pre-no-warmup", "--nsp", "--vocab", str(vocab), "--max-updates", "2") == 0
    assert json.loads((out / "results.json").read_text())["outcome"] == "stopped"
    assert pretrain(corpus, out, "--recipe", "pre-no-warmup", "--nsp", "--resume") == 0
    resumed = read_csv(str(out / "metrics.csv"))
    whole = read_csv(str(pretrained / "metrics.csv"))
    assert [r["updates"] for r in resumed] == ["2", "4"]
    for a, b in zip(resumed, whole):  # the batches depend on (seed, update) only
        assert float(a["valid_loss"]) == pytest.approx(float(b["valid_loss"]), abs=1e-4)
    assert json.loads((out / "state.json").read_text())["updates"] == 4
    # resumed again, the run has ended: it says so and changes nothing
    before = {name: (out / name).read_bytes() for name in ("results.json", "metrics.csv", "state.json")}
    assert pretrain(corpus, out, "--recipe", "pre-no-warmup", "--nsp", "--resume") == 2
    assert {name: (out / name).read_bytes() for name in before} == before


def test_divergence_is_a_result(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    assert pretrain(corpus, out, "--optimizer", "sgd", "--lr", "1e12", "--clip-norm", "0", "--no-warmup") == 0
    assert json.loads((out / "results.json").read_text())["outcome"] == "diverged"
    assert read_csv(str(out / "metrics.csv"))[-1]["outcome"] == "diverged"
    assert "diverged" in capsys.readouterr().out


def test_speedup_is_where_pre_ln_reaches_post_ln_final_loss():
    post = [dict(updates=u, valid_loss=v) for u, v in ((100, 5.0), (200, 4.0), (300, 3.5))]
    pre = [dict(updates=u, valid_loss=v) for u, v in ((100, 4.2), (200, 3.4), (300, 3.0))]
    gain = sweeps.speedup(post, pre, unigram_entropy=4.25)
    assert gain == dict(target_loss=3.5, post_update=300, pre_update=200, ratio=pytest.approx(1.5),
                        speedup=pytest.approx(0.5), unigram_entropy=4.25)


def test_unigram_entropy_counts_word_pieces_only():
    from harness import bert_data

    ids = np.array([[bert_data.CLS, 7, 7, 8, 9, bert_data.SEP, bert_data.PAD, bert_data.PAD]])
    p = np.array([0.5, 0.25, 0.25])
    assert bert_data.unigram_entropy(ids) == pytest.approx(float(-(p * np.log(p)).sum()))


def test_fig5s_speed_up_compares_each_placements_run_of_lowest_final_loss():
    """speedup.json pairs Post-LN's and Pre-LN's runs at their chosen rates, whatever the runs' order (the
    protocol's grid lists two Post-LN runs first): lowest final loss, ties to the smaller rate, diverged last."""
    from reproduction import sweeps

    results = {"post-warmup-lr1e-4": dict(norm="post", lr=1e-4, final_valid_loss=7.2),
               "post-warmup-lr3e-4": dict(norm="post", lr=3e-4, final_valid_loss=6.9),
               "post-warmup-lr1e-3": dict(norm="post", lr=1e-3, final_valid_loss=6.9),
               "pre-no-warmup-lr1e-4": dict(norm="pre", lr=1e-4, final_valid_loss=7.0),
               "pre-no-warmup-lr3e-3": dict(norm="pre", lr=3e-3, final_valid_loss=float("nan"), outcome="diverged"),
               "pre-no-warmup-lr1e-3": dict(norm="pre", lr=1e-3, final_valid_loss=6.8)}
    assert sweeps._lowest_loss_pair(results) == ("post-warmup-lr3e-4", "pre-no-warmup-lr1e-3")


def test_sweep_fig5(fig5):
    table = read_csv(str(fig5 / "results.csv"))
    assert [(r["run"], r["outcome"], r["updates"]) for r in table] == [("post-warmup", "finished", "4"),
                                                                      ("pre-no-warmup", "finished", "4")]
    post = json.loads((fig5 / "post-warmup" / "config.json").read_text())
    assert (post["norm"], post["lr"], post["no_warmup"], post["schedule"]["class_name"]) == \
        ("post", 1e-4, False, "LinearWarmup")
    pre = json.loads((fig5 / "pre-no-warmup" / "config.json").read_text())
    assert os.path.basename(pre["tokenizer"]) == os.path.basename(post["tokenizer"])  # one shared vocabulary
    curves = read_csv(str(fig5 / "curves.csv"))
    assert [(r["run"], r["updates"]) for r in curves] == [("post-warmup", "2"), ("post-warmup", "4"),
                                                         ("pre-no-warmup", "2"), ("pre-no-warmup", "4")]
    gain = json.loads((fig5 / "speedup.json").read_text())
    assert (fig5 / "curves.png").is_file() and "speedup" in gain
    assert (gain["post_run"], gain["pre_run"]) == ("post-warmup", "pre-no-warmup")
    first = json.loads((fig5 / "post-warmup" / "results.json").read_text())
    assert gain["unigram_entropy"] == first["unigram_entropy"] > 0
    assert gain["code_version"]["fingerprint"] == rundir.fingerprint()


# --- fine-tuning -----------------------------------------------------------------------------------

def write_mrpc(folder, rows_train=8, rows_dev=4, label=None):
    rng = random.Random(2)
    folder.mkdir(exist_ok=True)
    for split, count in (("train", rows_train), ("dev", rows_dev)):
        lines = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        lines += [f"{label if label is not None else i % 2}\t{i}\t{i + 1}\t{sentence(rng)}\t{sentence(rng)}"
                  for i in range(count)]
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_finetune_two_steps_reports_a_confidence_interval(pretrained, tmp_path, capsys):
    def finetune(out, state):
        random.seed(state)  # a process of its own starts with another global random state
        return pretrain_bert.main(["--finetune", "mrpc", "--glue-dir", str(write_mrpc(tmp_path / "mrpc")), "--init",
                                   str(pretrained / "checkpoints" / "step4.keras"), "--seeds", "2", "--epochs", "1",
                                   "--batch-size", "4", "--preset", "tiny", "--out", str(out)])

    out = tmp_path / "ft"
    assert finetune(out, 1) == 0
    rows = read_csv(str(out / "finetune.csv"))
    assert [(r["seed"], r["epoch"]) for r in rows] == [("1", "1"), ("2", "1")]
    # The same flags give the same fine-tuning (the dropout masks included), whatever came before.
    assert finetune(tmp_path / "again", 2) == 0
    again = read_csv(str(tmp_path / "again" / "finetune.csv"))
    assert [(r["train_loss"], r["dev_accuracy"]) for r in again] == [(r["train_loss"], r["dev_accuracy"]) for r in rows]
    summary = read_csv(str(out / "results.csv"))
    assert len(summary) == 1 and summary[0]["pretraining_updates"] == "4" and summary[0]["seeds"] == "2"
    assert 0 <= float(summary[0]["dev_accuracy_mean"]) <= 1 and float(summary[0]["dev_accuracy_ci95"]) >= 0
    assert (out / "finetune.png").is_file() and "95 % CI over 2 seeds" in capsys.readouterr().out


def test_confidence_interval_uses_the_t_distribution():
    mean, half = glue.confidence_interval([0.80, 0.82, 0.84])
    assert mean == pytest.approx(0.82) and half == pytest.approx(4.302653 * 0.02 / np.sqrt(3), rel=1e-5)


# --- bad input -------------------------------------------------------------------------------------

def translation_checkpoint(tmp_path):
    from conftest import tiny_translation

    model = tiny_translation("post")
    model.build()
    path = str(tmp_path / "nmt.keras")
    model.save(path)
    return path


@pytest.mark.parametrize("case, message", [
    ("empty corpus", "no text in the corpus"),
    ("missing corpus", "no such file or directory"),
    ("unknown recipe", "argument --recipe: invalid choice: 'cosine' (choose from"),
    ("long warmup", "is not shorter than training"),
    ("adam betas", "--adam-betas must be in [0, 1), got 1.5 0.999"),
    ("wrong columns", "MRPC needs the header Quality, #1 ID, #2 ID, #1 String, #2 String"),
    ("bad label", "label '2' is not one of MRPC's labels (0, 1)"),
    ("another architecture", "a TranslationTransformer checkpoint, another architecture"),
])
def test_bad_input_exits_2_with_one_line(case, message, corpus, pretrained, tmp_path, capsys):
    out = tmp_path / "out"
    checkpoint = str(pretrained / "checkpoints" / "step2.keras")
    glue = write_mrpc(tmp_path / "glue")
    if case == "empty corpus":
        (tmp_path / "empty.txt").write_text("\n\n  \n")
        code = pretrain(tmp_path / "empty.txt", out)
    elif case == "missing corpus":
        code = pretrain(tmp_path / "nowhere.txt", out)
    elif case == "unknown recipe":
        code = pretrain(corpus, out, "--recipe", "cosine")
    elif case == "long warmup":
        code = pretrain(corpus, out, "--warmup-steps", "9")
    elif case == "adam betas":
        code = pretrain(corpus, out, "--adam-betas", "1.5", "0.999")
    else:
        if case == "wrong columns":
            (glue / "dev.tsv").write_text("a\tb\tc\n1\tx\ty\n")
        elif case == "bad label":
            write_mrpc(glue, label=2)
        else:
            checkpoint = translation_checkpoint(tmp_path)
        code = pretrain_bert.main(["--finetune", "mrpc", "--glue-dir", str(glue), "--init", checkpoint,
                                   "--out", str(out)])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("pretrain_bert.py: error:")
    assert not out.exists()  # nothing half-written


def test_the_learned_vocabulary_is_numbered_alike_in_every_process(tmp_path):
    """The WordPiece trainer numbers pieces of equal count in an order that changes from process to process;
    build_tokenizer renumbers them (special tokens, then the pieces sorted), so three processes learning
    Figure 5's vocabulary (8,000 pieces of the shipped sample's training split) write one file."""
    import subprocess
    import sys

    learn = ("import sys; from harness import bert_data; documents = bert_data.load_corpus()[0]; "
             "train = bert_data.split_documents(documents, 1)[0]; "
             "print(bert_data.build_tokenizer(train, 8000, sys.argv[1])[1])")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = [subprocess.run([sys.executable, "-c", learn, str(tmp_path / f"v{i}")], cwd=root, capture_output=True,
                            text=True, check=True).stdout.strip() for i in range(3)]
    texts = [open(path, encoding="utf-8").read() for path in files]
    assert texts[0] == texts[1] == texts[2]
    vocab = json.loads(texts[0])["model"]["vocab"]
    pieces = sorted(vocab, key=vocab.get)
    assert pieces[:bert_data.FIRST_WORD_ID] == list(bert_data.SPECIAL_TOKENS)
    assert pieces[bert_data.FIRST_WORD_ID:] == sorted(pieces[bert_data.FIRST_WORD_ID:]) and len(pieces) == 8000
