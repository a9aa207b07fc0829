"""WMT14 English-German, prepared as fairseq's `examples/translation/prepare-wmt14en2de.sh` does it.

Input is a directory holding the archives the script downloads (nothing is downloaded here):

    training-parallel-europarl-v7.tgz   training/europarl-v7.de-en.{en,de}         statmt.org/wmt13
    training-parallel-commoncrawl.tgz   commoncrawl.de-en.{en,de}                  statmt.org/wmt13
    training-parallel-nc-v9.tgz         training/news-commentary-v9.de-en.{en,de}  statmt.org/wmt14
      or training-parallel-nc-v12.tgz   training/news-commentary-v12.de-en.{en,de} data.statmt.org/wmt17
    test-full.tgz                       test-full/newstest2014-deen-{src.en,ref.de}.sgm   statmt.org/wmt14
    dev.tgz                             dev/newstest2013.{en,de}  (only for valid="newstest2013")

News Commentary: the script's default is v12 (WMT17's release); its `--icml17` option takes v9, the WMT14
release, which with Europarl v7 and CommonCrawl is the ~4.5M-pair WMT14 training set of Vaswani et al.
and of the paper (Appendix A). `news_commentary=None` takes v9 when its archive is there, else v12.

Output is fairseq's layout, read by `nmt_data.load_corpus(out_dir, "en", "de")`:
`out_dir/{train,valid,test}.{en,de}` (BPE-split, cased, one sentence a line) and `out_dir/code`. The steps of
the shell script, in order:

  1. train: for each language, each corpus in the order above: `normalize-punctuation.perl $l |
     remove-non-printing-char.perl | tokenizer.perl -a -l $l`, appended into one file per language.
  2. test: from newstest2014-deen-src.en.sgm and -ref.de.sgm, the lines with `<seg id`, minus the seg tags
     and the whitespace around them, `’` -> `'`, then `tokenizer.perl -a -l $l` (no normalization).
  3. valid = every 100th tokenized training line (awk `NR%100 == 0`), train = the rest.
  4. `learn_bpe.py -s 40000` on train.en followed by train.de (joint BPE); `apply_bpe.py -c code` on
     train, valid and test.
  5. `clean-corpus-n.perl -ratio 1.5 ... 1 250` on the BPE-split train and valid: keep a pair if both sides
     have 1..250 tokens (BPE pieces, since cleaning comes after BPE) and neither side is more than 1.5
     times longer. Test is copied as it is.

The validation set: step 3 is the script's (`valid="split"`). The paper validates on newstest2013
(Appendix A), which the script names (`dev=dev/newstest2013`) but never uses. `valid="newstest2013"`
does that: every training line stays in train, and valid is dev/newstest2013.{en,de} from dev.tgz, treated
as the test set is (`’` -> `'`, tokenized, BPE-split, not cleaned). train_nmt.py's `--prepare-wmt14` uses
it, so that validation curves are the paper's (Figure 4(c, d)).

Moses steps use sacremoses, the Python port: `MosesPunctNormalizer(perl_parity=True)`, `MosesTokenizer`
with `aggressive_dash_splits=True` (`-a`: "well-known" -> "well @-@ known") and the perl defaults otherwise
(escaping on: `&apos;`, `&quot;`, `&amp;`, ...; see harness/iwslt14.py). remove-non-printing-char.perl replaces
each character of Unicode category C (control, format, unassigned, private use) by a space. Tokenization
runs in `workers` processes (the script's `-threads 8`); the result does not depend on their number. Nothing
is lowercased. The whole corpus is held in memory (several GB of RAM for WMT14's ~4.5M pairs); the time
the full preparation takes was not measured here (the tests use tiny archives).

Stricter than the shell script: a missing archive or member, misaligned sides, non-UTF-8 text or an empty
split raise `nmt_data.DataError`, and outputs are written atomically only once all steps succeeded.
"""

import concurrent.futures
import contextlib
import multiprocessing
import os

import regex
from sacremoses import MosesPunctNormalizer, MosesTokenizer

from harness import iwslt14
from harness.specs import WMT14_VALID as VALID_CHOICES
from harness.console import DataError

EUROPARL = ("training-parallel-europarl-v7.tgz", "training/europarl-v7.de-en", "http://statmt.org/wmt13/")
COMMONCRAWL = ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en", "http://statmt.org/wmt13/")
NEWS_COMMENTARY = {
    "v9": ("training-parallel-nc-v9.tgz", "training/news-commentary-v9.de-en", "http://statmt.org/wmt14/"),
    "v12": ("training-parallel-nc-v12.tgz", "training/news-commentary-v12.de-en",
            "http://data.statmt.org/wmt17/translation-task/"),
}
TEST = ("test-full.tgz", "test-full/newstest2014-deen-{side}.{lang}.sgm", "http://statmt.org/wmt14/")
DEV = ("dev.tgz", "dev/newstest2013", "http://data.statmt.org/wmt17/translation-task/")
SRC, TGT = "en", "de"  # the script's direction; files are named by language, so de -> en reads the same files
VALID_EVERY = 100
MIN_TOKENS, MAX_TOKENS, MAX_RATIO = 1, 250, 1.5
CHUNK_LINES = 20000  # lines per tokenization job


# --- reading the archives ----------------------------------------------------------------------------------

def archive_path(archive_dir, name, url):
    """The path of the archive `name` in archive_dir; DataError naming it and its `url` when it is missing."""
    path = os.path.join(archive_dir, name)
    if not os.path.isfile(path):
        raise DataError(f"{path}: archive not found; put {name} ({url}{name}), as prepare-wmt14en2de.sh "
                        f"downloads it, in {archive_dir}")
    return path


def read_members(path, wanted, url):
    """{member name: lines} of the members `wanted` in one tgz, read in one pass, never extracted; a byte-order
    mark at the start of a member is dropped."""
    fix = f"download {url}{os.path.basename(path)} again"
    found = iwslt14.read_members(path, wanted, fix, "the WMT14 archive")
    missing = [name for name in wanted if name not in found]
    if missing:
        raise DataError(f"{path}: member{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing; "
                        f"prepare-wmt14en2de.sh reads {', '.join(wanted)} from it; {fix}")
    lines = {}
    for name in wanted:
        try:
            text = found[name].decode("utf-8")
        except UnicodeDecodeError as error:
            line = found[name].count(b"\n", 0, error.start) + 1
            raise DataError(f"{path}: member {name} line {line} is not valid UTF-8 ({error.reason}); the "
                            f"release is UTF-8; {fix}") from None
        lines[name] = text.removeprefix("\ufeff").split("\n")
        if lines[name] and lines[name][-1] == "":
            lines[name].pop()  # the final newline ends the last line, it does not start a new one
    return lines


def pick_news_commentary(archive_dir, news_commentary):
    """The News Commentary version to read: as asked, else v9 when its archive is there, else v12."""
    if news_commentary is None:
        present = [v for v, spec in NEWS_COMMENTARY.items() if os.path.isfile(os.path.join(archive_dir, spec[0]))]
        news_commentary = present[0] if present else "v9"
    if news_commentary not in NEWS_COMMENTARY:
        raise DataError(f"news_commentary {news_commentary!r}: expected v9 (WMT14, the script's --icml17) or "
                        "v12 (the script's default)")
    return news_commentary


# --- the text steps ---------------------------------------------------------------------------------------

def _process_chunk(job):
    """normalize-punctuation | remove-non-printing-char | tokenizer -a, or tokenizer -a alone."""
    lines, lang, normalize = job
    if normalize:
        normalizer = MosesPunctNormalizer(lang=lang, perl_parity=True)
        lines = [regex.sub(r"\p{C}", " ", normalizer.normalize(line)) for line in lines]
    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True) for line in lines]


def tokenize(lines, lang, normalize=True, workers=1):
    """The Moses pipeline on `lines`, in `workers` processes of CHUNK_LINES lines each; order is kept."""
    jobs = [(lines[i:i + CHUNK_LINES], lang, normalize) for i in range(0, len(lines), CHUNK_LINES)]
    if workers <= 1 or len(jobs) <= 1:
        return [line for job in jobs for line in _process_chunk(job)]
    # spawn, not fork: the parent may hold a multithreaded deep-learning runtime
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return [line for chunk in pool.map(_process_chunk, jobs) for line in chunk]


def aligned(path, names, first, second):
    """DataError unless the two sides, read from the members `names`, have as many lines."""
    if len(first) != len(second):
        raise DataError(f"{path}: {names[0]} has {len(first)} lines but {names[1]} has {len(second)}; the "
                        "sides must be aligned line by line; download the archive again")


def load_texts(archive_dir, valid, news_commentary):
    """Raw {corpus: (en lines, de lines)} of the training corpora, and of "test" (and "valid" from dev.tgz)."""
    corpora, texts = (EUROPARL, COMMONCRAWL, NEWS_COMMENTARY[news_commentary]), {}
    paths = [archive_path(archive_dir, name, url)
             for name, _, url in corpora + (TEST,) + ((DEV,) if valid == "newstest2013" else ())]
    for path, (_, stem, url) in zip(paths, corpora):
        names = [f"{stem}.{SRC}", f"{stem}.{TGT}"]
        members = read_members(path, names, url)
        texts[stem] = tuple(members[name] for name in names)
        aligned(path, names, *texts[stem])
    names = [TEST[1].format(side="src", lang=SRC), TEST[1].format(side="ref", lang=TGT)]
    members = read_members(paths[3], names, TEST[2])
    texts["test"] = tuple(iwslt14.seg_text(members[name]) for name in names)
    aligned(paths[3], [f"{name} (<seg> lines)" for name in names], *texts["test"])
    if valid == "newstest2013":
        names = [f"{DEV[1]}.{SRC}", f"{DEV[1]}.{TGT}"]
        members = read_members(paths[4], names, DEV[2])
        texts["valid"] = tuple([line.replace("\u2019", "'") for line in members[name]] for name in names)
        aligned(paths[4], names, *texts["valid"])
    return [stem for _, stem, _ in corpora], texts


# --- the whole script -------------------------------------------------------------------------------------

def prepare_wmt14(archive_dir, out_dir, bpe_merges=40000, valid="split", news_commentary=None, workers=None,
                  log=print):
    """Prepare WMT14 en-de from the archives in archive_dir into fairseq's layout in out_dir; returns a summary.

    bpe_merges: learn_bpe.py -s (the script's 40000 gives the paper's ~37K joint vocabulary); valid: "split"
    (the script: every 100th training pair) or "newstest2013" (the paper); news_commentary: "v9", "v12" or
    None (v9 if present); workers: tokenization processes (default min(8, CPUs), the script's -threads 8).
    Raises DataError (a ValueError) for a missing or damaged archive or member, misaligned or non-UTF-8 text,
    an empty split, or an unwritable out_dir; then no output file is left behind."""
    archive_dir, out_dir = os.fspath(archive_dir), os.fspath(out_dir)
    if valid not in VALID_CHOICES:
        raise DataError(f"valid {valid!r}: expected {' or '.join(VALID_CHOICES)}")
    if not isinstance(bpe_merges, int) or bpe_merges < 0:
        raise DataError(f"bpe_merges {bpe_merges!r}: expected a whole number >= 0 (the script uses 40000)")
    if not os.path.isdir(archive_dir):
        raise DataError(f"{archive_dir}: not a directory; pass the directory holding the WMT14 archives "
                        f"({EUROPARL[0]}, {COMMONCRAWL[0]}, {NEWS_COMMENTARY['v9'][0]}, {TEST[0]}, {DEV[0]})")
    workers = min(8, os.cpu_count() or 1) if workers is None else workers
    news_commentary = pick_news_commentary(archive_dir, news_commentary)
    created = not os.path.exists(out_dir)
    try:
        iwslt14.check_out_dir(out_dir)
        splits = tokenized_splits(archive_dir, valid, news_commentary, workers, log)
        codes, learned, bpe = joint_bpe(splits, bpe_merges, log)
        clean_splits(bpe, ("train", "valid") if valid == "split" else ("train",), archive_dir, log)
        write_splits(out_dir, codes, bpe)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)  # only if still empty: leave no trace of a failed run
        raise
    summary = {"out_dir": out_dir, "valid_set": valid, "news_commentary": news_commentary, "bpe_merges": learned,
               **{split: len(sides[0]) for split, sides in bpe.items()}}
    log(f"wmt14: wrote {out_dir}: train {summary['train']}, valid {summary['valid']} ({valid}), test "
        f"{summary['test']} pairs, {learned} BPE merges")
    return summary


def tokenized_splits(archive_dir, valid, news_commentary, workers, log):
    """{split: (en lines, de lines)} of train, valid and test, tokenized (steps 1-3): the training corpora
    normalized and tokenized, one after the other; test tokenized alone; valid every 100th training line, or
    newstest2013 tokenized alone."""
    stems, texts = load_texts(archive_dir, valid, news_commentary)
    train = ([], [])
    for stem in stems:
        log(f"wmt14: normalizing and tokenizing {len(texts[stem][0])} lines per language of {stem}")
        for side, (lines, lang) in enumerate(zip(texts.pop(stem), (SRC, TGT))):
            train[side].extend(tokenize(lines, lang, workers=workers))
    test = tuple(tokenize(lines, lang, False, workers) for lines, lang in zip(texts["test"], (SRC, TGT)))
    if valid == "split":
        return {"train": tuple([line for i, line in enumerate(side, 1) if i % VALID_EVERY] for side in train),
                "valid": tuple([line for i, line in enumerate(side, 1) if not i % VALID_EVERY] for side in train),
                "test": test}
    return {"train": train, "valid": tuple(tokenize(lines, lang, False, workers)
                                           for lines, lang in zip(texts["valid"], (SRC, TGT))), "test": test}


def joint_bpe(splits, bpe_merges, log):
    """(codes, merges learned, {split: (en lines, de lines) BPE-split}): step 4, `bpe_merges` joint merges
    learned on train.en followed by train.de, applied to every split."""
    train_both = splits["train"][0] + splits["train"][1]  # cat train.en train.de > train.de-en
    log(f"wmt14: learning {bpe_merges} joint BPE merges on {len(train_both)} lines")
    codes, learned = iwslt14.learn_bpe(train_both, bpe_merges, log, name="wmt14")
    del train_both
    return codes, learned, {split: tuple(iwslt14.apply_bpe(codes, side) for side in sides)
                            for split, sides in splits.items()}


def clean_splits(bpe, cleaned, archive_dir, log):
    """Step 5 on the `cleaned` splits of `bpe`, in place: clean-corpus-n keeps the pairs of MIN_TOKENS to
    MAX_TOKENS pieces a side, neither side more than MAX_RATIO times the other. DataError when a split of
    `bpe` is empty then."""
    for split in cleaned:
        kept = iwslt14.clean_corpus(*bpe[split], ratio=MAX_RATIO, low=MIN_TOKENS, high=MAX_TOKENS)
        log(f"wmt14: clean-corpus kept {len(kept)} of {len(bpe[split][0])} {split} pairs")
        bpe[split] = tuple(map(list, zip(*kept))) if kept else ([], [])
    for split, sides in bpe.items():
        if not sides[0]:
            raise DataError(f"{archive_dir}: the {split} split is empty after preparation (train and the "
                            f"split valid keep pairs of {MIN_TOKENS}-{MAX_TOKENS} tokens with ratio <= "
                            f"{MAX_RATIO}; the split valid needs {VALID_EVERY} training lines); check the "
                            "archives")


def write_splits(out_dir, codes, bpe):
    """Write `codes` as out_dir/code and each split's sides as out_dir/SPLIT.LANG, one line each, atomically."""
    files = {"code": codes}
    for split, sides in bpe.items():
        for lang, lines in zip((SRC, TGT), sides):
            files[f"{split}.{lang}"] = "".join(line + "\n" for line in lines)
    iwslt14.write_outputs(out_dir, files)
