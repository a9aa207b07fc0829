"""IWSLT14 German-English, prepared as fairseq's `examples/translation/prepare-iwslt14.sh` does it.

Input is the raw IWSLT 2014 TED release archive `de-en.tgz` (https://wit3.fbk.eu/archive/2014-01/texts/de/en/
de-en.tgz, mirrored by fairseq); nothing is downloaded here. Output is fairseq's layout, read by
`nmt_data.load_corpus(out_dir)`: `out_dir/{train,valid,test}.{de,en}` (BPE-split, one sentence a line) and
`out_dir/code` (the BPE merges). The steps of the shell script, in order:

  1. train: `cat train.tags.de-en.$l | grep -v '<url>' | grep -v '<talkid>' | grep -v '<keywords>'`, then
     `sed` removes `<title>`, `</title>`, `<description>`, `</description>` (so titles and descriptions stay
     in as sentences), then `tokenizer.perl -threads 8 -l $l`.
     Only these three header tags are dropped: that is what prepare-iwslt14.sh does. The longer list
     (`<speaker>`, `<reviewer`, `<translator`, `<doc`, `</doc>`) belongs to fairseq's IWSLT17 script; using
     it here would drop lines that fairseq's IWSLT14 (160239 / 7283 / 6750 pairs) keeps.
  2. `clean-corpus-n.perl -ratio 1.5 ... 1 175`: keep a pair if both sides have 1..175 words and neither
     side is more than 1.5 times longer (see `clean_corpus`), then `lowercase.perl`.
  3. valid/test sources: from each `IWSLT14.TED*.$l.xml`, the lines with `<seg id`, minus the
     `<seg id="N">` and `</seg>` tags, with `’` replaced by `'`, then tokenized and lowercased (no cleaning).
  4. valid = every 23rd cleaned training pair (awk `NR%23 == 0`), train = the rest; test = dev2010,
     TEDX.dev2012, tst2010, tst2011, tst2012 concatenated in that order.
  5. `learn_bpe.py -s 10000` on train.de followed by train.en (joint BPE), `apply_bpe.py -c code` on every
     output file.

Moses tokenization uses sacremoses, the Python port of tokenizer.perl, with the perl script's defaults:
no aggressive hyphen splitting and escaping ON (`&` -> `&amp;`, `'` -> `&apos;`, `"` -> `&quot;`, `|` ->
`&#124;`, ...). Escaping is kept because it is the faithful choice: fairseq's IWSLT14 files, on which
IWSLT14 BLEU is usually reported, are escaped (`&apos;s`), and clean-corpus-n.perl deletes raw `|`
characters, which escaping protects as `&#124;`. Lowercasing is Python's `str.lower()` (perl's `lc`). Lines
are split at newline characters only, as grep and perl do (`str.splitlines` would also split at U+2028 etc.).

The release is de-en; `src`/`tgt` only select the pair folder, and files are named by language, so de->en and
en->de produce identical files. Stricter than the shell script: misaligned sides, an empty split or a
missing member raise `nmt_data.DataError`, and outputs are written atomically only once all steps succeeded.
"""

import contextlib
import io
import os
import re
import tarfile
import tempfile
import zlib

from sacremoses import MosesTokenizer
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe as subword_learn_bpe

from harness.console import DataError

DROP_TAGS = ("<url>", "<talkid>", "<keywords>")                        # grep -v
STRIP_TAGS = ("<title>", "</title>", "<description>", "</description>")  # sed s/...//g
TEST_SETS = ("IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
             "IWSLT14.TED.tst2012")
VALID_EVERY = 23
MIN_WORDS, MAX_WORDS, MAX_RATIO = 1, 175, 1.5
MAX_WORD_LENGTH = 1000  # clean-corpus-n.perl's default -max-word-length
SEG_OPEN = re.compile(r'<seg id="[0-9]*">\s*')
SEG_CLOSE = re.compile(r"\s*</seg>\s*")
URL = "https://wit3.fbk.eu/archive/2014-01/texts/de/en/de-en.tgz"
FIX = f"download the IWSLT14 release de-en.tgz again ({URL})"


# --- reading the archive -------------------------------------------------------------------------------

def member_names(pair):
    """The archive members prepare-iwslt14.sh reads for `pair` ("de-en"), language by language."""
    langs = pair.split("-", 1)
    names = {f"train.{lang}": f"{pair}/train.tags.{pair}.{lang}" for lang in langs}
    names.update({f"{name}.{lang}": f"{pair}/{name}.{pair}.{lang}.xml" for name in TEST_SETS for lang in langs})
    return names


def read_members(archive, wanted, fix=FIX, release="the IWSLT14 release"):
    """{member name: bytes} for the members in `wanted` that the archive holds, in one pass.

    Members are read with `extractfile`, never extracted, so absolute or `..` paths cannot write anywhere.
    An unreadable archive is a DataError naming it, what it should be (`release`) and the `fix`."""
    found = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = member.name[2:] if member.name.startswith("./") else member.name
                if name in wanted and member.isfile():
                    found[name] = tar.extractfile(member).read()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise DataError(f"{archive}: cannot be read as a gzip-compressed tar archive ({error}); it is corrupt, "
                        f"truncated or not {release}; {fix}") from None
    return found


def decode(archive, name, data):
    """Lines of a member, split on "\\n" like grep/perl; non-UTF-8 text raises DataError naming the line.

    A byte-order mark at the start of the member is dropped, so that it cannot stick to the first word."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataError(f"{archive}: member {name} line {line} is not valid UTF-8 ({error.reason}); the "
                        f"release is UTF-8, so the archive is damaged or not the original; {FIX}") from None
    lines = text.removeprefix("\ufeff").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline ends the last line, it does not start a new one
    return lines


# --- the text steps of prepare-iwslt14.sh ----------------------------------------------------------------

def train_text(lines):
    """grep -v the talk headers, sed away the title/description tags (their text stays)."""
    kept = [line for line in lines if not any(tag in line for tag in DROP_TAGS)]
    for tag in STRIP_TAGS:
        kept = [line.replace(tag, "") for line in kept]
    return kept


def seg_text(lines):
    """grep '<seg id', sed away the seg tags and the whitespace around them, ’ -> '."""
    segs = [line for line in lines if "<seg id" in line]
    return [SEG_CLOSE.sub("", SEG_OPEN.sub("", line)).replace("\u2019", "'") for line in segs]


def tokenize(lines, lang, aggressive=False):
    """tokenizer.perl -l lang with its defaults (escaping on, no -a); see the module docstring.

    aggressive: tokenizer.perl -a, hyphens split off as " @-@ " (WMT14's preparation, harness/wmt14.py)."""
    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, aggressive_dash_splits=aggressive, return_str=True, escape=True)
            for line in lines]


def clean_corpus(first, second, ratio=MAX_RATIO, low=MIN_WORDS, high=MAX_WORDS):
    """clean-corpus-n.perl: normalized (first, second) pairs with low..high words and a length ratio <= ratio.

    Like the perl script, `|` is deleted unless the first pair contains one (its "factored corpus" test),
    whitespace is collapsed before counting words, and a word over 1000 characters drops the pair."""
    factored = bool(first) and ("|" in first[0] or "|" in second[0])
    kept = []
    for a, b in zip(first, second):
        if not factored:
            a, b = a.replace("|", ""), b.replace("|", "")
        a, b = " ".join(a.split()), " ".join(b.split())
        na, nb = len(a.split(" ")) if a else 0, len(b.split(" ")) if b else 0
        if not (low <= na <= high and low <= nb <= high):
            continue
        if na / nb > ratio or nb / na > ratio:
            continue
        if max(len(word) for word in (a + " " + b).split(" ")) > MAX_WORD_LENGTH:
            continue
        kept.append((a, b))
    return kept


def learn_bpe(lines, merges, log, name="iwslt14"):
    """learn_bpe.py -s merges on `lines`; returns the codes file's text and the number of merges learned."""
    codes = io.StringIO()
    # subword-nmt takes max() over an empty pair table when every word is one character long
    if merges > 0 and any(len(word) > 1 for line in lines for word in line.split()):
        messages = io.StringIO()
        with contextlib.redirect_stderr(messages):  # its progress bar and its early-stop notice
            subword_learn_bpe(lines, codes, merges)
        for message in messages.getvalue().splitlines():
            if "Stopping" in message:
                log(f"{name}: subword-nmt: {message.strip()}")
    else:
        codes.write("#version: 0.2\n")
    text = codes.getvalue()
    return text, text.count("\n") - 1


def apply_bpe(codes, lines):
    """apply_bpe.py -c code: words split into `@@ `-joined subwords (unchanged when no merge was learned)."""
    if codes.count("\n") < 2:
        return list(lines)  # subword-nmt exits on a codes file without merges; no merges means no splits
    bpe = BPE(io.StringIO(codes))
    return [bpe.process_line(line) for line in lines]


# --- output ------------------------------------------------------------------------------------------------

def check_out_dir(out_dir):
    """Create out_dir if needed and make sure files can be written there (before minutes of work, not after)."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise DataError(f"output directory {out_dir} exists and is not a directory; pass a directory path")
    try:
        os.makedirs(out_dir, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out_dir, prefix=".iwslt14-probe-")
        os.close(fd)
        os.remove(probe)
    except OSError as error:
        raise DataError(f"output directory {out_dir} cannot be written ({error.strerror or error}); "
                        "pass a writable directory") from None


def write_outputs(out_dir, files):
    """Write {file name: text} atomically: all to temp files in out_dir first, then os.replace each."""
    temps = {}
    try:
        for name, text in files.items():
            fd, temps[name] = tempfile.mkstemp(dir=out_dir, prefix=f".{name}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
        for name in files:
            os.replace(temps.pop(name), os.path.join(out_dir, name))
    except OSError as error:
        raise DataError(f"output directory {out_dir} cannot be written ({error}); "
                        "pass a writable directory with free space") from None
    finally:
        for temp in temps.values():
            with contextlib.suppress(OSError):
                os.remove(temp)


# --- the whole script -------------------------------------------------------------------------------------

def load_release(archive, src, tgt):
    """(pair, {key: lines}) of the release's members; the folder may be named src-tgt or tgt-src."""
    candidates = [member_names(f"{src}-{tgt}"), member_names(f"{tgt}-{src}")]
    wanted = {name for names in candidates for name in names.values()}
    found = read_members(archive, wanted)
    names = next((names for names in candidates if any(n in found for n in names.values())), candidates[0])
    missing = [name for name in names.values() if name not in found]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise DataError(f"{archive}: member{'s' if len(missing) > 1 else ''} {shown} missing; the IWSLT14 release holds {{pair}}/train.tags."
                        f"{{pair}}.{{lang}} and {{pair}}/{{set}}.{{pair}}.{{lang}}.xml for the sets "
                        f"{', '.join(TEST_SETS)}; {FIX}")
    pair = names[f"train.{src}"].split("/")[0]
    return pair, {key: decode(archive, name, found[name]) for key, name in names.items()}


def preprocess(archive, pair, texts, log):
    """Tokenized, lowercased {split: (first-language lines, second-language lines)} before BPE."""
    langs = pair.split("-", 1)
    train = [train_text(texts[f"train.{lang}"]) for lang in langs]
    if len(train[0]) != len(train[1]):
        raise DataError(f"{archive}: after dropping the talk headers, train.tags.{pair}.{langs[0]} has "
                        f"{len(train[0])} lines but .{langs[1]} has {len(train[1])}; the sides must be aligned "
                        f"line by line; {FIX}")
    log(f"iwslt14: tokenizing {len(train[0])} training lines per language")
    pairs = clean_corpus(*(tokenize(lines, lang) for lines, lang in zip(train, langs)))
    log(f"iwslt14: clean-corpus kept {len(pairs)} of {len(train[0])} training pairs")
    if len(pairs) < VALID_EVERY:
        raise DataError(f"{archive}: only {len(pairs)} training pairs survive cleaning (1-{MAX_WORDS} words, "
                        f"ratio <= {MAX_RATIO}); at least {VALID_EVERY} are needed (every {VALID_EVERY}th is "
                        f"the valid set); {FIX}")
    pairs = [(a.lower(), b.lower()) for a, b in pairs]
    splits = {"train": [p for i, p in enumerate(pairs, 1) if i % VALID_EVERY],
              "valid": [p for i, p in enumerate(pairs, 1) if not i % VALID_EVERY], "test": []}
    for name in TEST_SETS:
        segs = [tokenize(seg_text(texts[f"{name}.{lang}"]), lang) for lang in langs]
        if len(segs[0]) != len(segs[1]):
            raise DataError(f"{archive}: {name} has {len(segs[0])} <seg> lines in .{langs[0]}.xml but "
                            f"{len(segs[1])} in .{langs[1]}.xml; the sides must be aligned; {FIX}")
        splits["test"] += [(a.lower(), b.lower()) for a, b in zip(*segs)]
    if not splits["test"]:
        raise DataError(f"{archive}: the dev/test XML files hold no <seg id=...> lines; {FIX}")
    return {split: tuple(map(list, zip(*rows))) for split, rows in splits.items()}


def prepare_iwslt14(archive, out_dir, src="de", tgt="en", bpe_merges=10000, log=print):
    """Prepare IWSLT14 from the release archive into fairseq's layout in out_dir; returns a summary dict.

    Raises DataError (a ValueError) for a missing or damaged archive, a missing member, non-UTF-8 text, an
    empty result, or an unwritable out_dir; then no output file is left behind."""
    archive, out_dir = os.fspath(archive), os.fspath(out_dir)
    if not (isinstance(src, str) and isinstance(tgt, str) and re.fullmatch(r"[a-z]{2,3}", src or "")
            and re.fullmatch(r"[a-z]{2,3}", tgt or "") and src != tgt):
        raise DataError(f"languages {src!r} -> {tgt!r}: expected two different language codes such as de and en")
    if not isinstance(bpe_merges, int) or bpe_merges < 0:
        raise DataError(f"bpe_merges {bpe_merges!r}: expected a whole number >= 0 (fairseq uses 10000)")
    if not os.path.exists(archive):
        raise DataError(f"{archive}: archive not found; pass the path of the IWSLT14 release de-en.tgz ({URL})")
    if not os.path.isfile(archive):
        raise DataError(f"{archive}: not a file; pass the path of the IWSLT14 release archive de-en.tgz")
    created = not os.path.exists(out_dir)
    try:
        check_out_dir(out_dir)
        pair, texts = load_release(archive, src, tgt)
        splits = preprocess(archive, pair, texts, log)
        train_both = splits["train"][0] + splits["train"][1]  # cat train.de train.en > train.en-de
        log(f"iwslt14: learning {bpe_merges} joint BPE merges on {len(train_both)} lines")
        codes, learned = learn_bpe(train_both, bpe_merges, log)
        files = {"code": codes}
        for split, sides in splits.items():
            for lang, lines in zip(pair.split("-", 1), sides):
                files[f"{split}.{lang}"] = "".join(line + "\n" for line in apply_bpe(codes, lines))
        write_outputs(out_dir, files)
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)  # only if still empty: leave no trace of a failed run
        raise
    summary = {"out_dir": out_dir, "pair": pair, "src": src, "tgt": tgt, "bpe_merges": learned,
               **{split: len(sides[0]) for split, sides in splits.items()}}
    log(f"iwslt14: wrote {out_dir}: train {summary['train']}, valid {summary['valid']}, test {summary['test']} "
        f"pairs, {learned} BPE merges")
    return summary
