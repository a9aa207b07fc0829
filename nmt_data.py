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
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

PAD, EOS, UNK = 0, 1, 2
DING_PATH = "/usr/share/trans/de-en"
MULTI30K_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "multi30k")
MULTI30K_FILES = {"train": "train", "valid": "val", "test": "test_2016_flickr"}  # split -> file stem
CORPORA = ("multi30k", "ding", "synthetic")
BPE_MARKER = "@@ "


class DataError(ValueError):
    """Bad input data: the message names the problem and the fix (scripts print it and exit 2)."""


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
    lines = [line for pair in train_pairs for line in (pair if side is None else pair[side:side + 1])]
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

# Padded lengths: each is one compiled shape of the train step (about 10 s of XLA compilation on a CPU), so
# few and coarse; the padding they add costs less than more compilations would on short runs.
BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256)


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


def make_batches(examples, max_tokens, seed=None, buckets=BUCKETS):
    """Token-count batches with length bucketing.

    An example goes to the smallest bucket length L in `buckets` that holds its source and its target
    plus EOS (longer ones are dropped); a batch of that bucket has max(1, max_tokens // L) rows (filled
    up with padding rows), so only len(buckets) shapes ever occur. With `seed`, examples and batch
    order are shuffled.
    Each batch: dict(source_ids, decoder_input_ids) of shape (rows, L) and labels (rows, L).
    """
    if max_tokens < BUCKETS[0]:
        raise DataError(f"--max-tokens {max_tokens} is too small; use at least {BUCKETS[0]} (default 4096)")
    rng = random.Random(seed)
    by_bucket = {}
    for src, tgt in examples:
        length = max(len(src), len(tgt) + 1)
        bucket = next((b for b in buckets if b >= length), None)
        if bucket is None:
            continue
        by_bucket.setdefault(bucket, []).append((src, tgt))
    batches = []
    for bucket, items in sorted(by_bucket.items()):
        if seed is not None:
            rng.shuffle(items)
        rows = max(1, max_tokens // bucket)
        for start in range(0, len(items), rows):
            chunk = items[start:start + rows]
            source = np.full((rows, bucket), PAD, "int32")
            decoder_in = np.full((rows, bucket), PAD, "int32")
            labels = np.full((rows, bucket), PAD, "int32")
            for i, (src, tgt) in enumerate(chunk):
                source[i, :len(src)] = src
                decoder_in[i, :len(tgt) + 1] = [EOS] + tgt
                labels[i, :len(tgt) + 1] = tgt + [EOS]
            batches.append(({"source_ids": source, "decoder_input_ids": decoder_in}, labels))
    if seed is not None:
        rng.shuffle(batches)
    return batches
