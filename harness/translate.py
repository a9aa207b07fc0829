"""train_nmt.py --translate: a trained run's model on raw text, as fairseq-interactive does.

    translate_stream("runs/NAME", None, spec.decoding)   # lines from standard input, one translation out each
    model, run_dir, path = translation_checkpoint("runs/NAME")         # its newest checkpoint (--eval-only too)
    lines = translate_text(model, vocab, ["Ein Hund läuft."], beam=5)  # raw text in, detokenized text out

A mode of its own: train_nmt.py imports it for --translate and --eval-only, and the training path does not.
The model decodes with harness/nmt_job.py's beam search; the run's own vocabulary, preprocessing (Moses
tokenization and BPE for fairseq-layout corpora) and decoding settings come from its config.json.
"""

import contextlib
import itertools
import os
import sys

from sacremoses import MosesDetokenizer

from harness import iwslt14, nmt_data
from harness.callbacks import load_checkpoint, load_latest_checkpoint
from harness.console import UsageError
from harness.files import check_run_path
from harness.nmt_job import beam_step, translate
from harness.rundir import RunDir
from harness.specs import DECODING, DECODING_BUCKETS, EOS, check_decoding, decoding_summary, length_rules
from models import TranslationTransformer


# --- the command line's --translate --------------------------------------------------------------

def translate_stream(path, input_file, decoding):
    """--translate RUN_OR_CHECKPOINT (`path`): source lines in (standard input, or the file `input_file`),
    translations out, decoded as the spec's decoding part `decoding` says.

    What fairseq-interactive gives: the run's own vocabulary, preprocessing and decoding settings (beam,
    length penalty and rules, <unk> penalty from its config.json; the flags override them); exactly one line
    on standard output per input line, in order, and everything else on standard error, so that the command
    composes in a pipe (`... | sacrebleu ref.en`).
    Lines are translated as they arrive from a terminal, in chunks of 256 otherwise. train_nmt.py has checked
    that `path` and `input_file` exist (`files.check_run_path`).
    """
    with contextlib.redirect_stdout(sys.stderr):  # messages of the libraries stay off the translations
        model, run_dir, checkpoint = translation_checkpoint(path)
        config, vocab = _run_vocabulary(run_dir, model)
        # The run's own decoding settings where the command line gave none (older runs' config.json lack
        # the length rules): a decoding part of its own for this translation.
        decoding = decoding.but(**{key: config[key] for key in DECODING if key not in decoding.given and key in config})
        check_decoding(decoding)
        codes = os.path.join(config.get("data_dir") or "", "code")
        codec = text_codec(vocab.source, open(codes, encoding="utf-8").read() if config.get("bpe_split") and
                           os.path.isfile(codes) else None, config.get("src", "de"), config.get("tgt", "en"))
        step = beam_step(model, decoding.beam, decoding.unkpen)
    print(f"translating with {checkpoint}: beam {decoding.beam}, lenpen {decoding.lenpen}, "
          f"{decoding_summary(decoding)}", file=sys.stderr, flush=True)
    stream = open(input_file, "rb") if input_file else sys.stdin.buffer
    chunk, number = (1 if stream.isatty() else 256), 0
    while True:
        raw = list(itertools.islice(stream, chunk))
        if not raw:
            break
        lines = []
        for line in raw:
            number += 1
            try:
                text = line.decode("utf-8").rstrip("\n").rstrip("\r")
                lines.append(text.removeprefix("\ufeff") if number == 1 else text)  # a byte-order mark: dropped
            except UnicodeDecodeError:
                raise UsageError(f"input line {number} is not valid UTF-8; convert the text to UTF-8 (e.g. with "
                                 "iconv)") from None
        with contextlib.redirect_stdout(sys.stderr):
            outputs = translate_text(model, vocab, lines, decoding.beam, decoding.lenpen,
                                     config.get("max_tokens", 4096), step, codec, **length_rules(decoding))
        sys.stdout.write("".join(line + "\n" for line in outputs))
        sys.stdout.flush()
    return number


def translation_checkpoint(path, flag="--translate"):
    """(model, `RunDir`, checkpoint path) of a run directory's newest checkpoint, or of a checkpoint; `flag`
    names the flag that gave `path` in a refusal."""
    check_run_path(path, flag)
    if os.path.isdir(path):
        _, model, checkpoint = load_latest_checkpoint(RunDir(path).checkpoints, expect=TranslationTransformer)
        return model, RunDir(path), checkpoint
    model = load_checkpoint(path, expect=TranslationTransformer)
    return model, RunDir.of_checkpoint(path), path


def _run_vocabulary(run_dir, model):
    """The config.json and the `nmt_data.Dictionaries` of the run that wrote `run_dir` (a `RunDir`), checked
    against the model."""
    try:
        config = run_dir.config()
    except (OSError, ValueError):
        raise UsageError(f"{run_dir.path}: no readable config.json; --translate needs a run directory of "
                         "train_nmt.py or "
                         "a checkpoint inside one (RUN/checkpoints/epochN.keras)") from None
    if not config.get("vocab_file"):
        raise UsageError(f"{run_dir.file('config.json')} names no vocabulary file (vocab_file): a run of an older "
                         "version of train_nmt.py; train it again to translate with it")
    path = run_dir.file(config["vocab_file"])
    vocab = nmt_data.load_vocabulary(path)
    source = nmt_data.load_vocabulary(run_dir.file(config["source_vocab_file"])) \
        if config.get("source_vocab_file") else vocab
    sizes = model.get_config()
    for which, path, size in ((vocab, path, sizes["vocab_size"]),
                              (source, source.path, sizes.get("source_vocab_size") or sizes["vocab_size"])):
        if which.size != size:
            raise UsageError(f"{path} has {which.size} entries but the checkpoint's model has {size}; the checkpoint "
                             "belongs to another run")
    return config, nmt_data.Dictionaries(source, vocab)


# --- raw text in, plain text out ----------------------------------------------------------------

def text_codec(vocab, bpe_codes=None, lang="de", tgt="en"):
    """(prepare, finish) of the source `vocab`: raw source text -> the model's input text, and decoded output
    -> plain text.

    A sentencepiece vocabulary takes raw text as it is. A vocabulary of BPE-split tokens (fairseq's
    layout, e.g. IWSLT14 from harness/iwslt14.py or WMT14 from harness/wmt14.py) needs the corpus's own preprocessing:
    Moses tokenization (with -a, hyphens as " @-@ ", when the vocabulary holds "@-@", as WMT14's does),
    lowercasing when the vocabulary has no upper-case token (IWSLT14 is lowercased, WMT14 is not), and the
    BPE merges `bpe_codes`; its output is Moses-detokenized. Without the merges, input is taken as already
    preprocessed.
    """
    if vocab.processor is not None:
        return (lambda line: line), (lambda text: text)
    detokenizer = MosesDetokenizer(lang=tgt)
    cased = any(token != token.lower() for token in vocab.tokens)
    aggressive = "@-@" in vocab.index

    def prepare(line):
        tokens = iwslt14.tokenize([line], lang, aggressive)[0]
        return iwslt14.apply_bpe(bpe_codes, [tokens if cased else tokens.lower()])[0]

    return (prepare if bpe_codes is not None else lambda line: line), lambda text: detokenizer.detokenize(text.split())


def translate_text(model, vocab, lines, beam=5, lenpen=1.2, max_tokens=4096, step_fn=None, codec=None, **options):
    """Translate raw source `lines`; one output line per input line, in order (blank in, blank out).

    `vocab`: the joint `nmt_data.Vocabulary`, or `nmt_data.Dictionaries` (source, target).
    `options`: unkpen, max_len_a, max_len_b, min_len, progress (`translate`); no progress unless asked for,
    since the translations may be what standard output is for."""
    options.setdefault("progress", None)
    source, target = vocab if isinstance(vocab, tuple) else (vocab, vocab)  # Dictionaries: a named tuple
    prepare, finish = codec or text_codec(source)
    limit = DECODING_BUCKETS[-1] - 1  # a longer source is cut to the longest padded length, as in testing
    todo = [i for i, line in enumerate(lines) if line.strip()]
    examples = [(source.encode(prepare(lines[i]))[:limit] + [EOS], []) for i in todo]
    outputs = [""] * len(lines)
    if examples:
        for i, ids in zip(todo, translate(model, examples, beam, lenpen, max_tokens, step_fn, **options)):
            outputs[i] = finish(target.decode(ids))
    return outputs
