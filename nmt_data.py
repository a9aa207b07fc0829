"""Translation data: parallel files, the built-in corpora, a joint subword vocabulary, token-count batches.

Used by train_nmt.py and analyze_grads.py. No network: data comes from `--data-dir` (fairseq's
`prepare-iwslt14.sh` layout, `{train,valid,test}.{src,tgt}`, one sentence a line), or, without it,
from one of the built-in corpora (`--corpus`, `CORPORA`):
  multi30k   (default) Multi30k Task 1 German-English (Elliott et al. 2016), shipped gzipped in
             data/multi30k/ (source, citation and terms in data/README.md): 29,000 / 1,014 / 1,000
             image captions, test = test_2016_flickr;
  ding       the German-English example sentences of the Ding dictionary, read where Debian's
             `trans-de-en` package installs it (`/usr/share/trans/de-en`; GPL, never copied here);
  synthetic  a German-to-English task generated here (`synthetic_pairs`): a small lexicon and grammar
             with German word order. Not natural language; for fast tests.

Token ids: 0 = padding, 1 = end of sentence (also the decoder's start symbol, as in fairseq), 2 = unknown.
"""

import gzip
import hashlib
import io
import os
import random
import re
import sys
import tempfile
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from errors import DataError

PAD, EOS, UNK = 0, 1, 2
DING_PATH = "/usr/share/trans/de-en"
MULTI30K_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "multi30k")
MULTI30K_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # split -> file stem
CORPORA = ("multi30k", "ding", "synthetic")
BPE_MARKER = "@@ "


# --- reading files ---------------------------------------------------------------------------------

def read_lines(path):
    """Lines of a UTF-8 text file (gzipped if its name ends in .gz) without trailing newlines; trailing
    blank lines dropped."""
    if not os.path.exists(path):
        raise DataError(f"{path}: file not found; pass --data-dir with {{train,valid,test}}.{{src,tgt}} files")
    if os.path.isdir(path):
        raise DataError(f"{path}: is a directory, expected a text file with one sentence a line")
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as error:  # gzip: truncated or not gzip at all
        raise DataError(f"{path}: cannot be decompressed ({error}); the file is damaged: restore it "
                        "(e.g. git checkout -- data/)") from None
    if b"\0" in raw:
        raise DataError(f"{path}: looks binary (contains NUL bytes); expected UTF-8 text, one sentence a line")
    lines = raw.split(b"\n")
    decoded = []
    for number, line in enumerate(lines, start=1):
        try:
            decoded.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as error:
            raise DataError(f"{path}: line {number} is not valid UTF-8 ({error.reason} at byte {error.start}); "
                            "convert the file to UTF-8, e.g. with iconv") from None
    while decoded and not decoded[-1].strip():
        decoded.pop()
    return decoded


def read_parallel(data_dir, split, src="de", tgt="en"):
    """(source, target) sentence pairs of `split` from `data_dir/split.src` and `data_dir/split.tgt`."""
    src_path, tgt_path = (os.path.join(data_dir, f"{split}.{lang}") for lang in (src, tgt))
    source, target = read_lines(src_path), read_lines(tgt_path)
    if len(source) != len(target):
        raise DataError(f"{src_path} has {len(source)} lines but {tgt_path} has {len(target)}; "
                        "the two sides of a parallel corpus must have one sentence a line, aligned")
    if not source:
        raise DataError(f"{src_path} and {tgt_path} are empty; the {split} split needs sentence pairs")
    return list(zip(source, target))


# --- the Ding dictionary's example sentences ---------------------------------------------------------

_ANNOTATION = re.compile(r"\s*(\{[^}]*\}|\[[^\]]*\])")
_SENTENCE_END = re.compile(r"[.!?]$")


def ding_pairs(path=DING_PATH):
    """Full-sentence German-English pairs of the Ding dictionary (`German :: English` lines).

    Sub-entries separated by " | " are aligned one to one; of alternatives separated by "; " the
    first is kept; annotations in {} and [] are removed. A pair is kept when both sides end with
    . ! or ?, and the German side starts with a capital and has at least three words.
    """
    pairs = []
    for line in read_lines(path):
        if line.startswith("#") or " :: " not in line:
            continue
        german, english = line.split(" :: ", 1)
        de_entries, en_entries = german.split(" | "), english.split(" | ")
        if len(de_entries) != len(en_entries):
            continue
        for de, en in zip(de_entries, en_entries):
            de = _ANNOTATION.sub("", de.split("; ")[0]).strip()
            en = _ANNOTATION.sub("", en.split("; ")[0]).strip()
            if (_SENTENCE_END.search(de) and _SENTENCE_END.search(en) and de[:1].isupper()
                    and len(de.split()) >= 3):
                pairs.append((de, en))
    return list(dict.fromkeys(pairs))  # unique, in file order


# --- the synthetic German-to-English task ------------------------------------------------------------

# (gender, German singular, German plural, English singular, English plural)
_NOUNS = [
    ("m", "Hund", "Hunde", "dog", "dogs"), ("m", "Mann", "Männer", "man", "men"),
    ("m", "Lehrer", "Lehrer", "teacher", "teachers"), ("m", "Vogel", "Vögel", "bird", "birds"),
    ("m", "Apfel", "Äpfel", "apple", "apples"), ("m", "Brief", "Briefe", "letter", "letters"),
    ("m", "Freund", "Freunde", "friend", "friends"), ("m", "Wagen", "Wagen", "car", "cars"),
    ("m", "Tisch", "Tische", "table", "tables"), ("m", "Koch", "Köche", "cook", "cooks"),
    ("f", "Katze", "Katzen", "cat", "cats"), ("f", "Frau", "Frauen", "woman", "women"),
    ("f", "Blume", "Blumen", "flower", "flowers"), ("f", "Stadt", "Städte", "city", "cities"),
    ("f", "Zeitung", "Zeitungen", "newspaper", "newspapers"), ("f", "Schwester", "Schwestern", "sister", "sisters"),
    ("f", "Lampe", "Lampen", "lamp", "lamps"), ("f", "Maus", "Mäuse", "mouse", "mice"),
    ("f", "Ärztin", "Ärztinnen", "doctor", "doctors"), ("f", "Tür", "Türen", "door", "doors"),
    ("n", "Kind", "Kinder", "child", "children"), ("n", "Buch", "Bücher", "book", "books"),
    ("n", "Haus", "Häuser", "house", "houses"), ("n", "Pferd", "Pferde", "horse", "horses"),
    ("n", "Bild", "Bilder", "picture", "pictures"), ("n", "Mädchen", "Mädchen", "girl", "girls"),
    ("n", "Brot", "Brote", "bread", "breads"), ("n", "Boot", "Boote", "boat", "boats"),
    ("n", "Fenster", "Fenster", "window", "windows"), ("n", "Lied", "Lieder", "song", "songs"),
]
_ADJECTIVES = [("groß", "big"), ("klein", "small"), ("alt", "old"), ("jung", "young"), ("rot", "red"),
               ("schnell", "fast"), ("müde", "tired"), ("schön", "beautiful"), ("neu", "new"), ("laut", "loud")]
# (German 3sg, 3pl, participle, infinitive, English 3sg, base, participle)
_TRANSITIVE = [
    ("sieht", "sehen", "gesehen", "sehen", "sees", "see", "seen"),
    ("findet", "finden", "gefunden", "finden", "finds", "find", "found"),
    ("kauft", "kaufen", "gekauft", "kaufen", "buys", "buy", "bought"),
    ("sucht", "suchen", "gesucht", "suchen", "looks for", "look for", "looked for"),
    ("mag", "mögen", "gemocht", "mögen", "likes", "like", "liked"),
    ("malt", "malen", "gemalt", "malen", "paints", "paint", "painted"),
    ("hört", "hören", "gehört", "hören", "hears", "hear", "heard"),
    ("braucht", "brauchen", "gebraucht", "brauchen", "needs", "need", "needed"),
]
_INTRANSITIVE = [
    ("schläft", "schlafen", "geschlafen", "schlafen", "sleeps", "sleep", "slept"),
    ("lacht", "lachen", "gelacht", "lachen", "laughs", "laugh", "laughed"),
    ("wartet", "warten", "gewartet", "warten", "waits", "wait", "waited"),
    ("arbeitet", "arbeiten", "gearbeitet", "arbeiten", "works", "work", "worked"),
]
_DITRANSITIVE = [("gibt", "geben", "gegeben", "geben", "gives", "give", "given"),
                 ("zeigt", "zeigen", "gezeigt", "zeigen", "shows", "show", "shown")]
_ADVERBS = [("heute", "today"), ("morgen", "tomorrow"), ("jetzt", "now"), ("oft", "often"),
            ("manchmal", "sometimes"), ("im Garten", "in the garden"), ("am Abend", "in the evening")]
_CONJUNCTIONS = [("weil", "because"), ("obwohl", "although"), ("wenn", "when")]
_REPORTERS = [("Ich glaube", "I think"), ("Sie sagt", "she says"), ("Er weiß", "he knows"),
              ("Wir hoffen", "we hope")]
_MODALS = [("will", "wollen", "wants to", "want to"), ("kann", "können", "can", "can"),
           ("muss", "müssen", "has to", "have to")]

_DEFINITE = {"nom": dict(m="der", f="die", n="das", p="die"), "acc": dict(m="den", f="die", n="das", p="die"),
             "dat": dict(m="dem", f="der", n="dem", p="den")}
_INDEFINITE = {"nom": dict(m="ein", f="eine", n="ein"), "acc": dict(m="einen", f="eine", n="ein"),
               "dat": dict(m="einem", f="einer", n="einem")}


def _adjective_ending(definite, case, gender):
    if case == "dat" or gender == "p":
        return "en"
    if definite:  # weak declension
        return "en" if (case == "acc" and gender == "m") else "e"
    return {"m": "er" if case == "nom" else "en", "f": "e", "n": "es"}[gender]  # mixed, after ein


def _noun_phrase(rng, case, allow_plural=True):
    """(German, English, plural?) for a random noun phrase in `case`."""
    gender, de_sg, de_pl, en_sg, en_pl = rng.choice(_NOUNS)
    plural = allow_plural and case != "dat" and rng.random() < 0.25
    definite = plural or rng.random() < 0.6
    g = "p" if plural else gender
    article = _DEFINITE[case][g] if definite else _INDEFINITE[case][g]
    noun_de, noun_en = (de_pl, en_pl) if plural else (de_sg, en_sg)
    words_de, words_en = [article], []
    if rng.random() < 0.35:
        adj_de, adj_en = rng.choice(_ADJECTIVES)
        words_de.append(adj_de.removesuffix("e") + _adjective_ending(definite, case, g))  # müde -> müden
        words_en.append(adj_en)
    words_de.append(noun_de)
    words_en.append(noun_en)
    en_article = "the" if definite else ("an" if words_en[0][0] in "aeiou" else "a")
    return " ".join(words_de), " ".join([en_article] + words_en), plural


def _clause(rng):
    """A main clause as (subject, finite verb, rest-before-verb-final part, verb-final part, English)."""
    kind = rng.random()
    subj_de, subj_en, plural = _noun_phrase(rng, "nom")
    if kind < 0.45:
        verb = rng.choice(_TRANSITIVE)
        obj_de, obj_en, _ = _noun_phrase(rng, "acc")
        return subj_de, verb[1 if plural else 0], obj_de, "", f"{subj_en} {verb[5 if plural else 4]} {obj_en}"
    if kind < 0.6:
        verb = rng.choice(_DITRANSITIVE)
        io_de, io_en, _ = _noun_phrase(rng, "dat")
        obj_de, obj_en, _ = _noun_phrase(rng, "acc")
        return (subj_de, verb[1 if plural else 0], f"{io_de} {obj_de}", "",
                f"{subj_en} {verb[5 if plural else 4]} {io_en} {obj_en}")
    if kind < 0.75:
        verb = rng.choice(_INTRANSITIVE)
        return subj_de, verb[1 if plural else 0], "", "", f"{subj_en} {verb[5 if plural else 4]}"
    if kind < 0.88:  # perfect tense: participle at the end
        verb = rng.choice(_TRANSITIVE)
        obj_de, obj_en, _ = _noun_phrase(rng, "acc")
        return (subj_de, "haben" if plural else "hat", obj_de, verb[2],
                f"{subj_en} {'have' if plural else 'has'} {verb[6]} {obj_en}")
    modal = rng.choice(_MODALS)  # modal verb: infinitive at the end
    verb = rng.choice(_TRANSITIVE)
    obj_de, obj_en, _ = _noun_phrase(rng, "acc")
    return (subj_de, modal[1 if plural else 0], obj_de, verb[3],
            f"{subj_en} {modal[3 if plural else 2]} {verb[5]} {obj_en}")


def _join(*parts):
    return " ".join(p for p in parts if p)


def _sentence(rng):
    subj, finite, middle, final, english = _clause(rng)
    form = rng.random()
    if form < 0.35:  # verb second: subject first
        german = _join(subj, finite, middle, final)
    elif form < 0.6:  # verb second: adverbial first, subject after the verb
        adv_de, adv_en = rng.choice(_ADVERBS)
        german = _join(adv_de.capitalize() if adv_de.islower() else adv_de, finite, subj, middle, final)
        english = f"{adv_en} {english}"
    elif form < 0.8:  # subordinate clause: verb final
        conj_de, conj_en = rng.choice(_CONJUNCTIONS)
        subj2, finite2, middle2, final2, english2 = _clause(rng)
        german = _join(subj, finite, middle, final) + f", {conj_de} " + _join(subj2, middle2, final2, finite2)
        english = f"{english}, {conj_en} {english2}"
    else:  # reported speech: "dass" clause, verb final
        rep_de, rep_en = rng.choice(_REPORTERS)
        german = f"{rep_de}, dass " + _join(subj, middle, final, finite)
        english = f"{rep_en} that {english}"
    return german[0].upper() + german[1:] + ".", english[0].upper() + english[1:] + "."


def synthetic_pairs(count=22000, seed=0):
    """`count` unique synthetic (German, English) pairs, the same for the same seed."""
    rng = random.Random(seed)
    pairs = {}
    for _ in range(count * 20):
        de, en = _sentence(rng)
        pairs.setdefault(de, en)
        if len(pairs) == count:
            break
    return list(pairs.items())


# --- corpora -----------------------------------------------------------------------------------------

@dataclass
class Corpus:
    name: str
    description: str
    splits: dict = field(default_factory=dict)  # split -> list of (source, target)
    bpe_split: bool = False  # already split with "@@ " markers (keep tokens, remove markers to score)


def split_pairs(pairs, seed, valid=1000, test=1000):
    """Deterministic train / valid / test split of a list of pairs."""
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    held = min(valid + test, len(pairs) // 5)
    n_valid = held * valid // (valid + test)
    pick = lambda idx: [pairs[i] for i in idx]  # noqa: E731
    return {"valid": pick(order[:n_valid]), "test": pick(order[n_valid:held]), "train": pick(order[held:])}


def multi30k_splits(directory=MULTI30K_DIR):
    """Multi30k's German-English {train, valid, test} pairs from its gzipped release files."""
    splits = {}
    for split, stem in MULTI30K_FILES.items():
        german, english = (read_lines(os.path.join(directory, f"{stem}.{lang}.gz")) for lang in ("de", "en"))
        if len(german) != len(english):
            raise DataError(f"{directory}/{stem}.de.gz has {len(german)} lines but {stem}.en.gz has "
                            f"{len(english)}; the files are damaged: restore them (e.g. git checkout -- data/)")
        splits[split] = list(zip(german, english))
    return splits


def load_corpus(data_dir=None, src="de", tgt="en", seed=1, corpus="multi30k", ding_path=DING_PATH):
    """The corpus to train on: `data_dir` if given, else the built-in `corpus` (one of CORPORA)."""
    if data_dir is not None:
        if not os.path.isdir(data_dir):
            raise DataError(f"--data-dir {data_dir}: not a directory; it should hold "
                            f"{{train,valid,test}}.{{{src},{tgt}}}")
        splits = {split: read_parallel(data_dir, split, src, tgt) for split in ("train", "valid", "test")}
        bpe = any(BPE_MARKER in s or BPE_MARKER in t for s, t in splits["train"][:2000])
        return Corpus(os.path.basename(os.path.normpath(data_dir)), f"{data_dir} ({src} -> {tgt})", splits, bpe)
    if corpus not in CORPORA:
        raise DataError(f"--corpus {corpus}: unknown; choose from {', '.join(CORPORA)}, or pass --data-dir")
    if (src, tgt) not in (("de", "en"), ("en", "de")):
        raise DataError(f"the built-in corpora are German-English; for {src} -> {tgt} pass --data-dir")
    if corpus == "multi30k":
        splits = multi30k_splits()
        description = "Multi30k Task 1 (Elliott et al. 2016; data/multi30k, test = test_2016_flickr)"
    elif corpus == "ding":
        if not os.path.isfile(ding_path):
            raise DataError(f"--corpus ding: {ding_path} not found; install Debian's trans-de-en "
                            "(apt-get install trans-de-en) or choose --corpus multi30k")
        splits = split_pairs(ding_pairs(ding_path), seed)
        description = f"Ding dictionary example sentences ({ding_path}, Debian package trans-de-en)"
    else:
        splits = split_pairs(synthetic_pairs(seed=0), seed)
        description = ("SYNTHETIC German-to-English task generated by nmt_data.synthetic_pairs (not natural "
                       "language: for fast tests; --corpus multi30k is real text)")
    if (src, tgt) == ("en", "de"):
        splits = {split: [(t, s) for s, t in pairs] for split, pairs in splits.items()}
    return Corpus(f"{corpus}-{src}-{tgt}", description + f" ({src} -> {tgt})", splits)


# --- vocabulary --------------------------------------------------------------------------------------

class Vocabulary:
    """Joint source-target subword vocabulary: sentencepiece BPE, or the tokens of BPE-split data."""

    def __init__(self, processor=None, tokens=None, path=None):
        self.processor, self.tokens, self.path = processor, tokens, path
        if tokens is not None:
            self.index = {t: i for i, t in enumerate(tokens)}

    @property
    def size(self):
        return self.processor.get_piece_size() if self.processor is not None else len(self.tokens)

    def encode(self, text):
        if self.processor is not None:
            return self.processor.encode(text)
        return [self.index.get(t, UNK) for t in text.split()]

    def decode(self, ids):
        """Ids (stopping at the first EOS, skipping padding) -> text; "@@ " markers removed."""
        ids = [int(i) for i in ids]
        if EOS in ids:
            ids = ids[:ids.index(EOS)]
        ids = [i for i in ids if i != PAD]
        if self.processor is not None:
            return self.processor.decode(ids)
        text = " ".join(self.tokens[i] for i in ids)
        return (text + " ").replace(BPE_MARKER, "").strip()


class Dictionaries(NamedTuple):
    """The source and the target vocabulary of a translation model: one object twice when joint.

    joint     (fairseq `--joined-dictionary`, `--share-all-embeddings`): one vocabulary of both sides,
              and the model shares one embedding between encoder, decoder and output.
    separate  (fairseq-preprocess's default, and its IWSLT'14 recipe with `--share-decoder-input-output-embed`):
              each side its own vocabulary; the encoder has its own embedding, the decoder's is shared
              with the output projection.
    """
    source: Vocabulary
    target: Vocabulary

    @property
    def joint(self):
        return self.source is self.target


DICTIONARIES = ("joint", "separate")


def build_dictionaries(train_pairs, vocab_size, cache_dir, bpe_split=False, kind="joint"):
    """`Dictionaries` of the training pairs: `build_vocabulary` of both sides, or of each side alone."""
    if kind not in DICTIONARIES:
        raise ValueError(f"kind must be one of {DICTIONARIES}, got {kind!r}")
    if kind == "joint":
        vocab = build_vocabulary(train_pairs, vocab_size, cache_dir, bpe_split)
        return Dictionaries(vocab, vocab)
    return Dictionaries(*(build_vocabulary(train_pairs, vocab_size, cache_dir, bpe_split, side=side) for side in (0, 1)))


def build_vocabulary(train_pairs, vocab_size, cache_dir, bpe_split=False, side=None):
    """Learn (or load from `cache_dir`) the vocabulary of the training pairs: of both sides (joint), or
    with `side` 0 or 1 of the source or the target side alone.

    Raw text: sentencepiece BPE over the lines; `vocab_size` is a soft limit, so a small corpus gets
    fewer pieces. BPE-split text (the fairseq layout): every token type of the training text, most
    frequent first, as `fairseq-preprocess --thresholdsrc 0 --thresholdtgt 0` keeps them; `vocab_size`
    (not None) keeps only the most frequent `vocab_size - 3` and the rest become <unk>.
    """
    if vocab_size is None and not bpe_split:
        raise ValueError("vocab_size is needed to learn a BPE vocabulary from raw text")
    if vocab_size is not None and vocab_size < 16:
        raise DataError(f"--vocab-size {vocab_size} is too small; use at least 16 (default 10000)")
    if side not in (None, 0, 1):
        raise ValueError(f"side must be None (both), 0 (source) or 1 (target), got {side!r}")
    digest = hashlib.sha1()
    for s, t in train_pairs:
        digest.update(f"{s}\t{t}\n".encode())
    key = (f"{'tokens' if bpe_split else 'spm'}-{vocab_size or 'all'}-{digest.hexdigest()[:12]}"
           + ("" if side is None else ("-source", "-target")[side]))
    os.makedirs(cache_dir, exist_ok=True)
    lines = (line for pair in train_pairs for line in (pair if side is None else pair[side:side + 1]))  # read only when learning
    if bpe_split:
        path = os.path.join(cache_dir, f"vocab-{key}.txt")
        if not os.path.exists(path):
            counts = {}
            for line in lines:
                for token in line.split():
                    counts[token] = counts.get(token, 0) + 1
            ranked = sorted(counts, key=lambda tok: (-counts[tok], tok))[: vocab_size and vocab_size - 3]
            _write_atomic(path, ("\n".join(["<pad>", "</s>", "<unk>"] + ranked) + "\n").encode())
        return load_vocabulary(path)
    import sentencepiece as spm

    path = os.path.join(cache_dir, f"{key}.model")
    if not os.path.exists(path):
        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines), model_writer=model, model_type="bpe", vocab_size=vocab_size,
                hard_vocab_limit=False, character_coverage=1.0, pad_id=PAD, eos_id=EOS, unk_id=UNK, bos_id=-1,
                num_threads=2, minloglevel=2,
            )
        except RuntimeError as error:  # sentencepiece reports bad sizes as RuntimeError("INTERNAL: ...")
            needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(error))
            if needed:
                raise DataError(f"--vocab-size {vocab_size} is too small for this corpus: its distinct characters "
                                f"and the special ids need {needed.group(1)}; use at least {needed.group(1)}") from None
            raise DataError(f"sentencepiece cannot learn a --vocab-size {vocab_size} vocabulary from the training "
                            f"data ({str(error).splitlines()[0][:200]}); check the data or change --vocab-size"
                            ) from None
        _write_atomic(path, model.getvalue())
    return load_vocabulary(path)


def load_vocabulary(path):
    """The vocabulary `build_vocabulary` wrote to `path`: a sentencepiece .model, or a token list."""
    if path.endswith(".model"):
        import sentencepiece as spm

        try:
            return Vocabulary(processor=spm.SentencePieceProcessor(model_file=path), path=path)
        except (OSError, RuntimeError) as error:
            raise DataError(f"{path}: not a sentencepiece model ({str(error).splitlines()[0][:120]}); the run's "
                            "vocabulary is damaged") from None
    return Vocabulary(tokens=read_lines(path), path=path)


def _write_atomic(path, data):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# --- batches -----------------------------------------------------------------------------------------

# Padded source lengths of decoding batches (decoding.translate): each is one compiled shape of the beam
# step, so few and coarse. The last is the longest pair training keeps (`encode_pairs`).
BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256)


def length_grid(step=0.1, longest=BUCKETS[-1]):
    """Padded lengths of training batches: 1, 2, ..., then each about `step` above the previous one,
    L_{k+1} = max(L_k + 1, round(L_k (1 + step))), up to `longest`: 1, 2, ..., 15, 17, 19, 21, 23, 25, 28,
    31, ..., 210, 231, 254, 256 (45 lengths). Padding an example to the next grid length adds at most
    about 10 % (one token below 15)."""
    grid = [1]
    while grid[-1] < longest:
        grid.append(min(longest, max(grid[-1] + 1, int(grid[-1] * (1 + step) + 0.5))))
    return tuple(grid)


LENGTH_GRID = length_grid()


def encode_pairs(pairs, vocab, max_length=BUCKETS[-1], drop_long=True):
    """Pairs of text -> list of (source ids + EOS, target ids), with a joint `Vocabulary` or `Dictionaries`.

    A side longer than max_length (with its EOS) drops the pair, or with drop_long=False is truncated,
    so that the examples stay aligned with the pairs (valid and test sets).
    """
    source, target = vocab if isinstance(vocab, Dictionaries) else (vocab, vocab)
    examples = []
    for s, t in pairs:
        src, tgt = source.encode(s), target.encode(t)
        if len(src) + 1 > max_length or len(tgt) + 1 > max_length:
            if drop_long:
                continue
            src, tgt = src[: max_length - 1], tgt[: max_length - 1]
        examples.append((src + [EOS], tgt))
    return examples


def num_tokens(examples):
    """fairseq's num_tokens of each example: max(source with EOS, target + 1), as an array. The decoder
    input (EOS + target) and the labels (target + EOS) have target + 1 tokens."""
    return np.array([max(len(src), len(tgt) + 1) for src, tgt in examples], dtype=np.int64).reshape(-1)


def plan_batches(lengths, max_tokens, seed=None, buckets=LENGTH_GRID, carry=True):
    """The batches of `make_batches` as [(L, rows, example indices)], from the examples' num_tokens.

    Examples are sorted by length (ties in a random order drawn from `seed`, in input order without
    one) and go up the grid `buckets`: at each grid length L, the examples with length in (previous L, L]
    and those carried from below fill as many full batches of rows = max(1, max_tokens // L) as they
    can; the rest (fewer than rows) is carried to the next grid length. The examples left at the end
    make the last batch, filled up with empty rows. carry=False pads each grid length's last batch
    instead (the bucketing this project used before). Lengths above buckets[-1] are dropped.
    """
    lengths = np.asarray(lengths)
    order = np.random.default_rng(seed).permutation(len(lengths)) if seed is not None else np.arange(len(lengths))
    order = order[np.argsort(lengths[order], kind="stable")]
    slot = np.searchsorted(np.asarray(buckets), lengths[order])  # the smallest grid length that holds each
    order, slot = order[slot < len(buckets)], slot[slot < len(buckets)]
    plan, pool, start = [], [], 0
    for k in range(int(slot[-1]) + 1 if len(slot) else 0):
        end = int(np.searchsorted(slot, k, side="right"))
        pool, start = pool + order[start:end].tolist(), end
        rows = max(1, max_tokens // buckets[k])
        full = len(pool) // rows * rows if carry and end < len(slot) else len(pool)
        plan += [(buckets[k], rows, pool[i:i + rows]) for i in range(0, full, rows)]
        pool = pool[full:]
    return plan


def make_batches(examples, max_tokens, seed=None, buckets=LENGTH_GRID):
    """Token-count batches as fairseq's (data_utils.batch_by_size): length-sorted examples, each batch
    filled up to `max_tokens`.

    An example's length is fairseq's num_tokens (`num_tokens`); a batch of padded length L has
    rows = max(1, max_tokens // L), so rows x L <= max_tokens (fairseq: bsz x max num_tokens <=
    max_tokens), with L on the grid `buckets` (default `LENGTH_GRID`, 10 % steps) so that each grid
    length is one shape and compiled train steps are reused: `plan_batches` says which examples share a
    batch. Only the longest batch has empty rows (and rows x L exceeds max_tokens only for an example
    longer than max_tokens, alone in its batch; fairseq refuses one). With `seed`, ties in length are broken at random and the
    batch order is shuffled: the same seed gives the same batches, and the number of batches does not
    depend on the seed. Without `seed`, batches go from short to long.
    Each batch: dict(source_ids, decoder_input_ids) of shape (rows, L) and labels (rows, L).
    How full the batches are: `batch_stats`.
    """
    if max_tokens < BUCKETS[0]:
        raise DataError(f"--max-tokens {max_tokens} is too small; use at least {BUCKETS[0]} (default 4096)")
    plan = plan_batches(num_tokens(examples), max_tokens, seed, buckets)
    if seed is not None:
        plan = [plan[i] for i in np.random.default_rng([seed, 1]).permutation(len(plan))]
    batches = []
    for length, rows, chunk in plan:
        source = np.full((rows, length), PAD, "int32")
        decoder_in = np.full((rows, length), PAD, "int32")
        labels = np.full((rows, length), PAD, "int32")
        for i, index in enumerate(chunk):
            src, tgt = examples[index]
            source[i, :len(src)] = src
            decoder_in[i, :len(tgt) + 1] = [EOS] + tgt
            labels[i, :len(tgt) + 1] = tgt + [EOS]
        batches.append(({"source_ids": source, "decoder_input_ids": decoder_in}, labels))
    return batches


def batch_stats(examples, max_tokens, buckets=LENGTH_GRID, carry=True):
    """How full `make_batches`' batches are (from lengths only; no arrays built):

        fill         = sum of num_tokens / sum of rows x L   (what the grid and the empty rows waste;
                       fairseq's own batches, padded to their longest example, come to about 0.99)
        source_fill  = source tokens (with EOS) / sum of rows x L
        target_fill  = target tokens (+ EOS) / sum of rows x L
        budget       = sum of rows x L / (batches x max_tokens)   (how much of --max-tokens is used)

    and the number of batches (updates per epoch) and of distinct (rows, L) shapes.
    """
    lengths = num_tokens(examples)
    plan = plan_batches(lengths, max_tokens, 0, buckets, carry)
    padded = sum(rows * length for length, rows, _ in plan)
    used = np.concatenate([chunk for _, _, chunk in plan]).astype(np.int64) if plan else np.zeros(0, np.int64)
    source = sum(len(examples[i][0]) for i in used)
    target = sum(len(examples[i][1]) + 1 for i in used)
    return dict(batches=len(plan), shapes=len({(rows, length) for length, rows, _ in plan}),
                fill=round(float(lengths[used].sum() / padded), 4), source_fill=round(source / padded, 4),
                target_fill=round(target / padded, 4), budget=round(padded / (len(plan) * max_tokens), 4))


def fairseq_batch_count(examples, max_tokens, multiple=8):
    """(batches, fill) of fairseq's batch_by_size on `examples`: sorted by source length then target
    length (LanguagePairDataset.ordered_indices), a batch grows while bsz x its longest num_tokens <=
    max_tokens, and a full batch keeps a multiple of `multiple` rows (--required-batch-size-multiple 8)."""
    lengths = num_tokens(examples)
    order = np.lexsort(([len(t) for _, t in examples], [len(s) for s, _ in examples]))
    count, padded, batch = 0, 0, []
    for n in lengths[order].tolist():
        if batch and (len(batch) + 1) * max(max(batch), n) > max_tokens:
            keep = max(multiple * (len(batch) // multiple), len(batch) % multiple)
            count, padded, batch = count + 1, padded + keep * max(batch[:keep]), batch[keep:]
        batch.append(n)
    count, padded = count + 1, padded + len(batch) * max(batch)
    return count, round(float(lengths.sum() / padded), 4)


def print_batch_stats():
    """`python nmt_data.py --batch-stats`: the figures of docs/translation.md's "Batches" paragraph.

    Multi30k's training pairs with the cpu preset's vocabulary (BPE 4,000) at 2,048 and 4,096 tokens:
    fill and updates per epoch of the coarse buckets used before (BUCKETS, a padded batch per bucket),
    of `make_batches` and of fairseq's batch_by_size. Then an estimate for IWSLT14 de-en (160,239
    pairs), whose text is not shipped: Multi30k's pairs drawn 160,239 times with their lengths scaled
    to a mean German side of 22, 25 or 28 BPE tokens (with EOS).
    """
    with tempfile.TemporaryDirectory() as cache:
        train = load_corpus().splits["train"]
        examples = encode_pairs(train, build_vocabulary(train, 4000, cache))
    print(f"Multi30k train: {len(examples)} pairs, mean num_tokens {num_tokens(examples).mean():.1f}")
    print("max_tokens  batches                        updates  fill    src    tgt  budget  shapes")
    for max_tokens in (2048, 4096):
        for name, buckets, carry in (("coarse buckets (before)", BUCKETS, False), ("LENGTH_GRID", LENGTH_GRID, True)):
            s = batch_stats(examples, max_tokens, buckets, carry)
            print(f"{max_tokens:>10}  {name:<29} {s['batches']:>8}  {s['fill']:.3f}  {s['source_fill']:.3f}  "
                  f"{s['target_fill']:.3f}  {s['budget']:.3f}  {s['shapes']:>6}")
        count, fill = fairseq_batch_count(examples, max_tokens)
        print(f"{max_tokens:>10}  {'fairseq batch_by_size':<29} {count:>8}  {fill:.3f}")
    rng = np.random.default_rng(0)
    drawn = [examples[i] for i in rng.integers(len(examples), size=160239)]
    source_mean = np.mean([len(s) for s, _ in drawn])
    for mean in (22, 25, 28):
        scale = mean / source_mean
        scaled = [([0] * round(len(s) * scale), [0] * round(len(t) * scale)) for s, t in drawn]
        s, (count, _) = batch_stats(scaled, 4096), fairseq_batch_count(scaled, 4096)
        print(f"IWSLT14 estimate, source mean {mean} (target {np.mean([len(t) + 1 for _, t in scaled]):.1f}): "
              f"{s['batches']} updates per epoch at 4096 tokens (fill {s['fill']:.3f}, {s['shapes']} shapes); "
              f"fairseq {count}; coarse buckets {batch_stats(scaled, 4096, BUCKETS, False)['batches']}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--batch-stats"]:
        sys.exit("usage: python nmt_data.py --batch-stats")
    print_batch_stats()
