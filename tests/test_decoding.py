"""Decoding's length rules (harness/nmt_job.py) and <unk> penalty, fairseq-generate's: --max-len-a/--max-len-b, --min-len, --unkpen."""

import io
import json
import math
import re
import sys

import numpy as np
import pytest
from conftest import tiny_translation, to_numpy

import train_nmt
from harness import nmt_data, nmt_job, specs
from harness.console import UsageError
from harness.nmt_data import EOS, UNK

VOCAB = 20


def fixed_model(scores):
    """A Pre-LN model whose logits are the same at every step: `scores` {token: logit}, 0 for the others.

    The final LayerNorm with gain 0 and bias e_0 outputs e_0 whatever its input, so the tied output
    projection gives logit_j = E[j, 0]: column 0 of the embedding is set to the scores."""
    model = tiny_translation("pre", vocab_size=VOCAB)
    model.build()
    embeddings = np.array(to_numpy(model.embedding.embeddings), "float32")
    embeddings[:, 0] = 0.0
    for token, logit in scores.items():
        embeddings[token, 0] = logit
    model.embedding.embeddings.assign(embeddings)
    norm = model.decoder_final_norm
    norm.gamma.assign(np.zeros(norm.gamma.shape, "float32"))
    norm.beta.assign(np.eye(1, norm.beta.shape[0], dtype="float32")[0])
    return model


def sources(*lengths):
    """A padded batch of sources with `lengths` tokens each (the last one EOS)."""
    rows = np.zeros((len(lengths), max(lengths)), "int32")
    for row, length in enumerate(lengths):
        rows[row, :length - 1] = 3 + np.arange(length - 1) % (VOCAB - 3)
        rows[row, length - 1] = EOS
    return rows


@pytest.mark.parametrize("beam", [1, 3])
def test_no_hypothesis_is_longer_than_max_len_a_times_source_plus_b(beam):
    model = fixed_model({7: 10.0, 8: 9.0, 9: 8.0, 10: 7.0})  # EOS is never chosen: every sentence hits its limit
    source = sources(4, 8, 2)
    step = nmt_job.beam_step(model, beam)
    hyps = nmt_job.beam_search(model, source, beam, max_len_a=0.5, max_len_b=3, step_fn=step)
    assert [len(h) for h in hyps] == [int(0.5 * 4 + 3), int(0.5 * 8 + 3), int(0.5 * 2 + 3)]  # 5, 7, 4: S with EOS
    assert hyps[0] == [7] * 5 or beam > 1
    capped = nmt_job.beam_search(model, source[:1], beam, max_len_a=0, max_len_b=10_000, step_fn=step)
    assert len(capped[0]) == specs.MAX_LEN == nmt_data.BUCKETS[-1] - 1  # positions the model was trained on


@pytest.mark.parametrize("beam", [1, 2])
def test_min_len_keeps_eos_from_ending_a_hypothesis_early(beam):
    model = fixed_model({EOS: 10.0, 7: 5.0, 8: 4.0})  # EOS is the argmax at every step, the first included
    source = sources(5, 3)
    step = nmt_job.beam_step(model, beam)
    assert nmt_job.beam_search(model, source, beam, min_len=0, step_fn=step) == [[], []]  # EOS first: empty
    assert nmt_job.beam_search(model, source, beam, step_fn=step) == [[7], [7]]  # default min_len 1
    hyps = nmt_job.beam_search(model, source, beam, min_len=3, step_fn=step)
    assert [len(h) for h in hyps] == [3, 3] and hyps[0][0] == 7
    with pytest.raises(ValueError, match="min_len 5 is above the length limit 4"):
        nmt_job.beam_search(model, source, beam, max_len_b=4, min_len=5, step_fn=step)


def test_unk_is_generated_unless_penalized():
    model = fixed_model({UNK: 10.0, EOS: 9.0, 7: 5.0})
    source = sources(4)
    assert nmt_job.beam_search(model, source, 1, max_len_b=6) == [[UNK] * 6]  # --unkpen 0: <unk> is a token
    # A penalty of 2 puts <unk> (10 - 2) below EOS (9): one <unk> (EOS cannot be first), then EOS; of 6,
    # below token 7 too.
    assert nmt_job.beam_search(model, source, 1, step_fn=nmt_job.beam_step(model, 1, unkpen=2.0)) == [[UNK]]
    assert nmt_job.beam_search(model, source, 1, step_fn=nmt_job.beam_step(model, 1, unkpen=6.0)) == [[7]]
    for beam in (1, 2):  # --unkpen inf: never
        hyps = nmt_job.beam_search(model, source, beam, step_fn=nmt_job.beam_step(model, beam, unkpen=math.inf))
        assert hyps == [[7]]
    # translate passes the settings through, and never pads a hypothesis with <pad>.
    examples = [(list(source[0]), [])]
    assert nmt_job.translate(model, examples, 1, 1.2, 256, max_len_b=3) == [[UNK] * 3]
    assert nmt_job.translate(model, examples, 1, 1.2, 256, unkpen=math.inf, min_len=2) == [[7, 7]]


def test_decoding_flags_default_to_fairseq_generate_and_are_checked():
    args = train_nmt.parse_args([])
    assert (args.max_len_a, args.max_len_b, args.min_len, args.unkpen) == (0.0, 200, 1, 0.0)
    assert specs.length_rules(args) == dict(max_len_a=0.0, max_len_b=200, min_len=1)
    args = train_nmt.parse_args(["--max-len-a", "1.2", "--max-len-b", "10", "--min-len", "0", "--unkpen", "inf"])
    assert args.given >= {"max_len_a", "max_len_b", "min_len", "unkpen"} and args.unkpen == math.inf
    train_nmt.check_args(args)
    for flags, message in ((["--max-len-a", "-1"], "--max-len-a must be"), (["--min-len", "300"], "--min-len 300"),
                           (["--max-len-b", "2", "--min-len", "3"], "--min-len 3"), (["--max-len-b", "0", "--min-len", "0"],
                           "--max-len-b must be"), (["--unkpen", "nan"], "--unkpen must be")):
        with pytest.raises(UsageError, match=message):
            train_nmt.check_args(train_nmt.parse_args(flags))


def test_redirected_decoding_prints_progress_lines(capsys, monkeypatch):
    """Standard output not a terminal: with progress_every=0 a line after each batch (sentences, rate, ETA)
    and a final one; with the default interval, a short decoding (a validation subset) prints the final
    line only; progress=None prints nothing. On a terminal, keras's bar instead of lines."""
    model = fixed_model({EOS: 10.0, 7: 5.0})  # every translation is [7]
    examples = [(list(sources(3 + i % 5)[0]), []) for i in range(12)]
    step = nmt_job.beam_step(model, 1)
    capsys.readouterr()
    assert nmt_job.translate(model, examples, 1, 1.2, 64, step, progress_every=0, max_len_b=3) == [[7]] * 12
    lines = capsys.readouterr().out.splitlines()
    shape = r"decoding: (\d+)/12 sentences \((\d+)%\), \d+\.\d sentences/s, \dm\d\ds elapsed(, ETA \dm\d\ds)?"
    assert len(lines) == 3 and all(re.fullmatch(shape, line) for line in lines), lines  # 4 sentences a batch
    assert lines[0].startswith("decoding: 4/12 sentences (33%), ") and ", ETA " in lines[0]
    assert lines[-1].startswith("decoding: 12/12 sentences (100%), ") and "ETA" not in lines[-1]
    nmt_job.translate(model, examples, 1, 1.2, 64, step, progress="test decoding", max_len_b=3)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("test decoding: 12/12 sentences (100%), ")
    nmt_job.translate(model, examples, 1, 1.2, 64, step, progress=None, max_len_b=3)
    assert capsys.readouterr().out == ""

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    nmt_job.translate(model, examples, 1, 1.2, 64, step, progress_every=0, max_len_b=3)
    assert "12/12" in terminal.getvalue() and "\r" in terminal.getvalue() and "decoding:" not in terminal.getvalue()


def test_translate_prints_only_translations_on_standard_output(tmp_path, capsys):
    """--translate: one translation per input line on standard output and nothing else, no progress
    (a run directory made by hand: a token vocabulary, config.json and a checkpoint)."""
    run = tmp_path / "run"
    (run / "vocab").mkdir(parents=True)
    (run / "vocab" / "vocab-words.txt").write_text("\n".join(["<pad>", "</s>", "<unk>"] + [f"w{i}" for i in
                                                                                          range(3, VOCAB)]) + "\n")
    (run / "config.json").write_text(json.dumps(dict(beam=2, max_len_b=5)))
    (run / "checkpoints").mkdir()
    fixed_model({EOS: 10.0, 7: 5.0}).save(str(run / "checkpoints" / "epoch1.keras"))  # every translation is "w7"
    text = tmp_path / "input.de"
    text.write_text("".join(f"w{3 + i % 10} w5\n" for i in range(12)))
    capsys.readouterr()
    assert train_nmt.main(["--translate", str(run), "--input", str(text)]) == 2  # config.json names no vocabulary
    assert "names no vocabulary file (vocab_file)" in capsys.readouterr().err
    (run / "config.json").write_text(json.dumps(dict(beam=2, max_len_b=5, vocab_file="vocab/vocab-words.txt")))
    assert train_nmt.main(["--translate", str(run), "--input", str(text)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "w7\n" * 12
    assert "beam 2" in captured.err and "sentences/s" not in captured.err


@pytest.mark.parametrize("beam", [1, 3])
def test_the_compiled_encoder_pass_gives_the_eager_ones_translations(beam):
    """beam_search runs the encoder and the cross-attention keys and values as one compiled program per
    batch shape (`BeamStep.encode`); the translations are those of the same work done operation by
    operation, for every shape of a bucket."""
    model = tiny_translation("post", vocab_size=VOCAB)
    model.build()
    rng = np.random.default_rng(5)
    model.set_weights([w + rng.normal(0, 0.5, np.shape(w)).astype("float32") for w in model.get_weights()])
    step = nmt_job.beam_step(model, beam)
    eager = nmt_job.BeamStep(step.step, nmt_job._encode_for_decoding(model))
    for lengths in ((4, 8, 2), (16, 3), (5,)):
        source = sources(*lengths)
        assert nmt_job.beam_search(model, source, beam, max_len_b=12, step_fn=step) == nmt_job.beam_search(
            model, source, beam, max_len_b=12, step_fn=eager)


@pytest.mark.parametrize("beam", [1, 3])
def test_a_translation_does_not_depend_on_its_padded_length(beam):
    """`translate` pads a batch to the next of DECODING_BUCKETS; padding keys are masked, so a sentence
    padded to 16 or to 64 positions gets the same translation (the buckets can be coarse)."""
    model = tiny_translation("pre", vocab_size=VOCAB)
    model.build()
    rng = np.random.default_rng(7)
    model.set_weights([w + rng.normal(0, 0.5, np.shape(w)).astype("float32") for w in model.get_weights()])
    step = nmt_job.beam_step(model, beam)
    source = sources(9, 14, 5)
    for width in nmt_data.DECODING_BUCKETS[:3]:
        padded = np.zeros((len(source), width), "int32")
        padded[:, :source.shape[1]] = source
        assert nmt_job.beam_search(model, padded, beam, max_len_b=12, step_fn=step) == nmt_job.beam_search(
            model, source, beam, max_len_b=12, step_fn=step), width
