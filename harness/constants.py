"""The names and defaults that the command lines and the library share, in one place without Keras.

The scripts read them for their flags' choices and help before any backend is loaded; the data, decoding
and device modules read the same objects, so a new schedule is added here once (a new placement here and
in layers.py, which imports nothing of the project).
"""

# The three LayerNorm placements (layers.ResidualNorm) and their names in plots and tables. layers.py defines an
# identical NORMS of its own, so that its classes paste without the project; tests/test_layers.py checks the two.
# the papers' comparisons as one command (`--sweep NAME`; their runs: reproduction/experiments.py, which a training
# run does not import)
SWEEPS = ("fig2", "fig4", "depth")  # train_nmt.py
BERT_SWEEPS = ("fig5",)  # pretrain_bert.py

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

# --distribute, --precision and --peer-timeout (harness/devices.py, harness/processes.py).
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
AT_MOST_WHY = "a bound that keeps a batch and its arrays within memory, harness/constants.py"
