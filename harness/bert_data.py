"""BERT pretraining and GLUE data: corpus, document split, WordPiece, sequence packing, masking, TSV files.

Used by pretrain_bert.py. No network: text comes from `--corpus` (BERT's format: one sentence a line,
a blank line between documents; plain, .gz or .bz2), or, without it, from the English Wikipedia sample
shipped in data/wikipedia/ (`enwiki-sample.txt.bz2`: 103 articles of a Wikipedia dump, markup stripped;
how it was made, its source and terms in data/README.md).

Token ids: 0 = [PAD], 1 = [UNK], 2 = [CLS], 3 = [SEP], 4 = [MASK]; word pieces from 5 on.
"""

import hashlib
import json
import os
import random

import numpy as np
from tokenizers import Tokenizer, normalizers, pre_tokenizers, trainers
from tokenizers import models as tokenizer_models

from harness.console import DataError
from harness.files import read_lines, write_atomic

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD, UNK, CLS, SEP, MASK = range(len(SPECIAL_TOKENS))
FIRST_WORD_ID = len(SPECIAL_TOKENS)
WIKI_SAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "wikipedia",
                           "enwiki-sample.txt.bz2")  # the default corpus (data/README.md)
VALID_SHARE = 200  # documents split 199:1 into train and validation (Xiong et al., Appendix A)


# --- corpora -----------------------------------------------------------------------------------------

def read_corpus(paths):
    """Documents (lists of sentences) of BERT-format text files, or of every file below a directory.

    One sentence a line, a blank line between documents (BERT's `create_pretraining_data.py` input);
    files may be gzipped (.gz) or bzip2-compressed (.bz2).
    """
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(os.path.join(root, name) for root, dirs, names in os.walk(path)
                            for name in names if not name.startswith("."))
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise DataError(f"--corpus {path}: no such file or directory; pass text files (one sentence a line, "
                            "a blank line between documents) or directories of them")
    documents = []
    for path in files:
        document = []
        for line in read_lines(path) + [""]:
            if line.strip():
                document.append(line.strip())
            elif document:
                documents.append(document)
                document = []
    if not documents:
        raise DataError(f"--corpus {' '.join(paths)}: no text in the corpus; the files should hold one sentence "
                        "a line, with a blank line between documents")
    return documents


def load_corpus(paths=None):
    """(documents, description): `paths` if given, else the Wikipedia sample of data/wikipedia."""
    if paths:
        documents = read_corpus(paths)
        return documents, f"{' '.join(paths)} ({len(documents)} documents)"
    documents = read_corpus([WIKI_SAMPLE])
    return documents, f"English Wikipedia sample (data/wikipedia, {len(documents)} articles)"


def split_documents(documents, seed, min_valid_sentences=500):
    """Seeded 199:1 split of whole documents into (train, valid), each side in corpus order.

    Documents, not lines, are split, so that no document lends sentences to both sides. Documents are
    held out in a seeded random order until the validation side has 1/200 of them (at least one) and
    at least min(`min_valid_sentences`, 5 % of all sentences): on a corpus of a hundred articles, one
    held-out article may be a one-line stub, too little for a validation loss. Training keeps at least
    one document.
    """
    if len(documents) < 2:
        raise DataError(f"the corpus has {len(documents)} document; the train/validation split needs at least 2 "
                        "(separate documents with a blank line)")
    order = list(range(len(documents)))
    random.Random(seed).shuffle(order)
    want_documents = max(1, round(len(documents) / VALID_SHARE))
    want_sentences = min(min_valid_sentences, sum(map(len, documents)) // 20)
    held, sentences = [], 0
    for i in order[:-1]:
        if len(held) >= want_documents and sentences >= want_sentences:
            break
        held.append(i)
        sentences += len(documents[i])
    kept = set(held)
    return ([d for i, d in enumerate(documents) if i not in kept], [d for i, d in enumerate(documents) if i in kept])


# --- WordPiece ---------------------------------------------------------------------------------------

def build_tokenizer(train_documents, vocab_size, cache_dir):
    """Learn (or load from `cache_dir`) an uncased WordPiece vocabulary of the training documents.

    BERT's pipeline in the `tokenizers` library (a dependency of keras-hub): the BERT normalizer
    (lowercase, strip accents, clean control characters), BERT's pre-tokenizer (split on white space
    and punctuation) and the WordPiece trainer, continuation pieces marked `##`. keras-hub's
    `compute_word_piece_vocabulary` learns the same kind of vocabulary, but took 116 s on the default
    corpus here against 2 s, and loads TensorFlow under every backend.
    Returns (tokenizer, path of its JSON file).
    """
    if vocab_size < 2 * FIRST_WORD_ID:
        raise DataError(f"--vocab-size {vocab_size} is too small; use at least {2 * FIRST_WORD_ID} (base 30522)")
    digest = hashlib.sha1()
    for document in train_documents:
        digest.update(("\n".join(document) + "\n\n").encode())
    os.makedirs(cache_dir, exist_ok=True)
    path = os.path.join(cache_dir, f"wordpiece-{vocab_size}-{digest.hexdigest()[:12]}.json")
    if not os.path.exists(path):
        tokenizer = Tokenizer(tokenizer_models.WordPiece(unk_token="[UNK]"))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                            show_progress=False)
        tokenizer.train_from_iterator((s for document in train_documents for s in document), trainer)
        write_atomic(path, json.dumps(in_one_order(json.loads(tokenizer.to_str())), ensure_ascii=False))
    return load_tokenizer(path), path


def in_one_order(tokenizer):
    """A tokenizers JSON (dict) whose WordPiece ids are numbered in one order: the special tokens first as
    they are, then every other piece sorted. The trainer numbers pieces of equal count in an order that
    changes from process to process (tokenizers 0.23), so without this two runs of one command would
    learn the same pieces under other ids and not repeat their numbers; WordPiece splits words the same
    whatever the ids."""
    vocab = tokenizer["model"]["vocab"]
    special = sorted((item["id"], item["content"]) for item in tokenizer.get("added_tokens", []))
    pieces = [content for _, content in special] + sorted(set(vocab) - {content for _, content in special})
    return dict(tokenizer, model=dict(tokenizer["model"], vocab={piece: i for i, piece in enumerate(pieces)}))


def load_tokenizer(path):
    """A tokenizer JSON file of `build_tokenizer`, or a DataError naming what is wrong with it."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: tokenizer file not found; pass RUN/vocab/wordpiece-*.json of a pretrain_bert.py run")
    try:
        tokenizer = Tokenizer.from_file(path)
    except Exception as error:  # the tokenizers library raises its own exception type for bad JSON
        raise DataError(f"{path}: not a tokenizer file ({str(error).splitlines()[0][:120]})") from None
    if [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] != list(range(FIRST_WORD_ID)):
        raise DataError(f"{path}: not a tokenizer of pretrain_bert.py (its special tokens are not "
                        f"{', '.join(SPECIAL_TOKENS)} = 0..{FIRST_WORD_ID - 1})")
    return tokenizer


def encode_documents(documents, tokenizer):
    """Documents of sentences -> documents of word-piece id lists (empty sentences dropped)."""
    flat = [s for document in documents for s in document]
    ids = [e.ids for e in tokenizer.encode_batch(flat, add_special_tokens=False)]
    encoded, start = [], 0
    for document in documents:
        sentences = [s for s in ids[start:start + len(document)] if s]
        start += len(document)
        if sentences:
            encoded.append(sentences)
    return encoded


# --- sequences ---------------------------------------------------------------------------------------

def truncate_pair(a, b, budget):
    """Shorten the longer of two token lists from its end until len(a) + len(b) <= budget (BERT)."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        (a if len(a) >= len(b) else b).pop()
    return a, b


def pair_row(a, b, seq_len):
    """[CLS] a [SEP] (b [SEP]) padded to seq_len: (token ids, segment ids), segment 1 on b's side."""
    tokens = [CLS] + a + [SEP] + (b + [SEP] if b else [])
    segments = [0] * (len(a) + 2) + [1] * (len(b) + 1 if b else 0)
    pad = seq_len - len(tokens)
    return tokens + [PAD] * pad, segments + [0] * pad


def _chunks(document, budget):
    """Consecutive sentences of a document packed greedily into chunks of at most `budget` tokens.

    A sentence longer than the budget is cut into budget-sized pieces (BERT truncates it).
    """
    chunks, current, length = [], [], 0
    for sentence in document:
        for start in range(0, len(sentence), budget):
            piece = sentence[start:start + budget]
            if current and length + len(piece) > budget:
                chunks.append(current)
                current, length = [], 0
            current.append(piece)
            length += len(piece)
    return chunks + ([current] if current else [])


def pack_sequences(documents, seq_len, next_sentence=False, seed=0):
    """Training sequences of `seq_len` tokens packed from consecutive sentences of each document.

    Without next-sentence pairs:  [CLS] s_i s_i+1 ... s_j [SEP] [PAD]...
    With them (BERT's NSP):       [CLS] A [SEP] B [SEP] [PAD]...,  A = the chunk's first sentences up to a
    random boundary, B = the rest (label 0, "is next") or, half of the time, as many tokens from a random
    place in another document (label 1, "random").
    Returns token_ids (N, seq_len), segment_ids (N, seq_len) int32 and next-sentence labels (N,).
    """
    rng = random.Random(seed)
    budget = seq_len - (3 if next_sentence else 2)
    rows, labels = [], []
    for index, document in enumerate(documents):
        for chunk in _chunks(document, budget):
            a, b, label = [t for s in chunk for t in s], [], 0
            if next_sentence:
                if len(chunk) == 1:  # one long sentence: cut it in the middle
                    chunk = [a[:len(a) // 2], a[len(a) // 2:]]
                cut = rng.randint(1, max(1, len(chunk) - 1))
                a, b = [t for s in chunk[:cut] for t in s], [t for s in chunk[cut:] for t in s]
                if len(documents) > 1 and rng.random() < 0.5:
                    other = documents[rng.choice([i for i in range(len(documents)) if i != index])]
                    start = rng.randrange(len(other))
                    b, label = [t for s in other[start:] for t in s][:max(len(b), 1)], 1
                a, b = truncate_pair(a, b, budget)
            rows.append(pair_row(a, b, seq_len))
            labels.append(label)
    if not rows:
        raise DataError("no sequence could be packed: the corpus has no tokens after WordPiece")
    tokens, segments = (np.array(x, dtype="int32") for x in zip(*rows))
    return tokens, segments, np.array(labels, dtype="int32")


def max_predictions(seq_len, mask_rate=0.15):
    """Prediction slots per sequence: ceil(mask_rate * seq_len) (BERT: 20 for 128)."""
    return int(np.ceil(mask_rate * seq_len))


def mask_tokens(token_ids, rng, vocab_size, num_predictions, mask_rate=0.15):
    """BERT's masked-LM corruption, in NumPy with a seeded Generator (deterministic on every backend).

    Of the word pieces of each sequence ([CLS], [SEP] and [PAD] are never chosen), n = round(0.15 * count)
    (at least 1, at most `num_predictions`) positions are chosen uniformly; each chosen token becomes
        [MASK]             with probability 0.8,
        a random token      with probability 0.1,
        itself              with probability 0.1,
    and is predicted. The random token is drawn uniformly from the whole vocabulary, special tokens
    included, as in google-research/bert create_pretraining_data.py (`vocab_words[rng.randint(0,
    len(vocab_words) - 1)]`), except [PAD]: the model finds padding by its id, so a [PAD] would also be
    hidden from attention. Fixed shapes (one compilation): positions, labels and weights are (B, P) with
    P = num_predictions; unused slots have position 0, label [PAD] and weight 0 (the loss skips [PAD]).
    Returns (corrupted token ids (B, T), positions, labels, weights).
    """
    batch, length = token_ids.shape
    candidates = token_ids >= FIRST_WORD_ID
    counts = np.minimum(num_predictions, np.maximum(1, np.round(mask_rate * candidates.sum(1)))).astype(int)
    scores = np.where(candidates, rng.random((batch, length)), 2.0)  # non-candidates sort last
    chosen = np.argsort(scores, axis=1, kind="stable")[:, :num_predictions]
    rows = np.arange(batch)[:, None]
    used = (np.arange(num_predictions)[None, :] < counts[:, None]) & candidates[rows, chosen]
    positions = np.where(used, chosen, 0).astype("int32")
    labels = np.where(used, token_ids[rows, chosen], PAD).astype("int32")
    action = rng.random((batch, num_predictions))
    random_ids = rng.integers(PAD + 1, vocab_size, (batch, num_predictions))
    replacement = np.where(action < 0.8, MASK, np.where(action < 0.9, random_ids, labels))
    corrupted = token_ids.copy()
    corrupted[rows, positions] = np.where(used, replacement, corrupted[rows, positions])
    return corrupted, positions, labels, used.astype("float32")


def batch_rows(count, batch_size):
    """(row indices, rows that count) of fixed-size batches covering `count` rows: one compiled shape.

    The last batch is filled up by wrapping around to the first rows, which are then not counted.
    """
    return [(np.arange(start, start + batch_size) % count, min(batch_size, count - start))
            for start in range(0, count, batch_size)]


def unigram_entropy(token_ids):
    """H = -sum_w p(w) ln p(w) over the word pieces of `token_ids` (special tokens left out), in nats: the
    masked-LM loss of a model that knows only how frequent each word piece is (Figure 5(a)'s floor of interest)."""
    ids = np.asarray(token_ids).ravel()
    counts = np.bincount(ids[ids >= FIRST_WORD_ID])
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def masked_batch(token_ids, segment_ids, nsp_labels, rng, vocab_size, num_predictions):
    """Model inputs and targets of one masked-LM batch: ({token_ids, segment_ids, mask_positions},
    {mlm_logits: labels[, nsp_logits: next-sentence labels]}); `nsp_labels` None leaves out NSP."""
    corrupted, positions, labels, _ = mask_tokens(token_ids, rng, vocab_size, num_predictions)
    inputs = {"token_ids": corrupted, "segment_ids": segment_ids, "mask_positions": positions}
    targets = {"mlm_logits": labels}
    if nsp_labels is not None:
        targets["nsp_logits"] = nsp_labels
    return inputs, targets


# --- GLUE --------------------------------------------------------------------------------------------

# Columns by header name, so that both RTE layouts (index, sentence1, sentence2, label / sentence1,
# sentence2, label, idx) read alike; labels as written in the files (RTE's also as 0 / 1).
GLUE_TASKS = {
    "mrpc": dict(name="MRPC", columns=("#1 String", "#2 String", "Quality"), labels={"0": 0, "1": 1},
                 layout="Quality, #1 ID, #2 ID, #1 String, #2 String"),
    "rte": dict(name="RTE", columns=("sentence1", "sentence2", "label"),
                labels={"entailment": 0, "not_entailment": 1, "0": 0, "1": 1},
                layout="index, sentence1, sentence2, label (or sentence1, sentence2, label, idx)"),
}


def read_glue_tsv(path, task):
    """(sentence a, sentence b, label id) rows of a GLUE TSV file with a header row.

    Fields are split on tabs only: MRPC's sentences hold unbalanced quotes, so no CSV quoting applies.
    """
    spec = GLUE_TASKS[task]
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found; --glue-dir should hold {spec['name']}'s train.tsv and dev.tsv")
    lines = read_lines(path)
    header = lines[0].split("\t") if lines else []  # read_lines drops a byte-order mark
    if not all(column in header for column in spec["columns"]):
        raise DataError(f"{path}: columns {', '.join(header) or '(none)'}; {spec['name']} needs the header "
                        f"{spec['layout']}")
    index = [header.index(column) for column in spec["columns"]]
    rows = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.split("\t")
        if len(fields) != len(header):
            raise DataError(f"{path}: line {number} has {len(fields)} tab-separated fields, the header "
                            f"{len(header)}; {spec['name']} rows are {spec['layout']}")
        a, b, label = (fields[i] for i in index)
        if label not in spec["labels"]:
            raise DataError(f"{path}: line {number}: label {label!r} is not one of {spec['name']}'s labels "
                            f"({', '.join(spec['labels'])})")
        rows.append((a, b, spec["labels"][label]))
    if not rows:
        raise DataError(f"{path}: no examples after the header")
    return rows


def read_glue(glue_dir, task):
    """{"train": rows, "dev": rows} of a GLUE task from `glue_dir` or from `glue_dir`/MRPC (RTE)."""
    spec = GLUE_TASKS[task]
    folder = next((d for d in (glue_dir, os.path.join(glue_dir, spec["name"]))
                   if os.path.isfile(os.path.join(d, "train.tsv"))), glue_dir)
    return {split: read_glue_tsv(os.path.join(folder, f"{split}.tsv"), task) for split in ("train", "dev")}


def encode_sentence_pairs(rows, tokenizer, seq_len):
    """GLUE rows -> token ids, segment ids (N, seq_len) of [CLS] a [SEP] b [SEP] and labels (N,)."""
    a_ids = [e.ids for e in tokenizer.encode_batch([r[0] for r in rows], add_special_tokens=False)]
    b_ids = [e.ids for e in tokenizer.encode_batch([r[1] for r in rows], add_special_tokens=False)]
    pairs = [pair_row(*truncate_pair(a, b, seq_len - 3), seq_len) for a, b in zip(a_ids, b_ids)]
    tokens, segments = (np.array(x, dtype="int32") for x in zip(*pairs))
    return tokens, segments, np.array([r[2] for r in rows], dtype="int32")
