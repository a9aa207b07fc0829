"""harness/nmt_data.py: parallel files, the default corpora, the joint vocabulary, token-count batches."""

import gzip
import os

import numpy as np
import pytest

from harness import iwslt14, nmt_data, synthetic
from harness.nmt_data import EOS, PAD, DataError

MULTI30K = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "multi30k-de-en")


def write(path, text, mode="w"):
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode == "wb":
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def fairseq_dir(tmp_path, pairs=(("ein Hund .", "a dog ."), ("zwei Katzen .", "two cats ."))):
    for split in ("train", "valid", "test"):
        write(tmp_path / f"{split}.de", "\n".join(s for s, _ in pairs) + "\n")
        write(tmp_path / f"{split}.en", "\n".join(t for _, t in pairs) + "\n")
    return tmp_path


def test_the_default_corpus_is_multi30k_shipped_in_the_project(monkeypatch):
    """Multi30k Task 1 from data/multi30k (offline: sockets are refused), with its documented sizes."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    corpus = nmt_data.load_corpus()
    assert corpus.name == "multi30k-de-en" and "Multi30k" in corpus.description
    assert {k: len(v) for k, v in corpus.splits.items()} == {"train": 29000, "valid": 1014, "test": 1000}
    assert all(s.strip() and t.strip() for split in corpus.splits.values() for s, t in split)
    assert not corpus.bpe_split
    assert corpus.splits["test"][0] == ("Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
                                        "A man in an orange hat starring at something.")
    reverse = nmt_data.load_corpus(src="en", tgt="de")
    assert reverse.splits["valid"][0] == corpus.splits["valid"][0][::-1]
    readme = open(os.path.join(os.path.dirname(nmt_data.MULTI30K_DIR), "README.md"), encoding="utf-8").read()
    assert "Elliott" in readme and "non-commercial" in readme  # source, citation and terms beside the data


@pytest.mark.skipif(not os.path.isdir(MULTI30K), reason="../shared/data/multi30k-de-en not present")
def test_the_shipped_multi30k_is_the_released_text():
    """The gzipped files in data/ hold the sentences of the plain-text copy (with its trailing blank
    line), but for 61 German validation sentences, which that copy has in another revision of val.de."""
    shipped = nmt_data.load_corpus()
    plain = nmt_data.load_corpus(MULTI30K)
    assert shipped.splits["train"] == plain.splits["train"] and shipped.splits["test"] == plain.splits["test"]
    valid = list(zip(shipped.splits["valid"], plain.splits["valid"]))
    assert len(valid) == 1014 and all(a[1] == b[1] for a, b in valid)
    assert sum(a[0] != b[0] for a, b in valid) == 61


def test_a_damaged_gzip_file_is_named(tmp_path):
    bad = tmp_path / "train.de.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00broken")
    with pytest.raises(DataError, match="train.de.gz: cannot be decompressed"):
        nmt_data.read_lines(str(bad))


def test_a_byte_order_mark_is_dropped_like_crlf_endings(tmp_path):
    """A corpus saved with a UTF-8 byte-order mark (and CRLF endings) reads the same as one without."""
    plain = fairseq_dir(tmp_path / "plain")
    marked = fairseq_dir(tmp_path / "marked")
    for name in ("train.de", "train.en", "test.de"):
        text = (marked / name).read_bytes()
        write(marked / name, b"\xef\xbb\xbf" + (text.replace(b"\n", b"\r\n") if name == "test.de" else text),
              mode="wb")
    gzipped = marked / "valid.en.gz"
    gzipped.write_bytes(gzip.compress(b"\xef\xbb\xbf" + (marked / "valid.en").read_bytes()))
    assert nmt_data.read_lines(str(marked / "train.de")) == nmt_data.read_lines(str(plain / "train.de")) \
        == ["ein Hund .", "zwei Katzen ."]
    assert nmt_data.read_lines(str(gzipped)) == nmt_data.read_lines(str(plain / "valid.en"))
    assert nmt_data.load_corpus(str(marked)).splits == nmt_data.load_corpus(str(plain)).splits
    assert nmt_data.read_lines(str(write(tmp_path / "mark-only.txt", b"\xef\xbb\xbf\n", mode="wb"))) == []
    inner = write(tmp_path / "inner.txt", "a\n\ufeffb\n")
    assert nmt_data.read_lines(str(inner)) == ["a", "\ufeffb"]  # only the file's first character is a byte-order mark
    assert iwslt14.decode("archive", "member", "\ufeff<url>x</url>\nHallo\n".encode()) == ["<url>x</url>", "Hallo"]


def test_parallel_file_errors_name_the_problem(tmp_path):
    data = fairseq_dir(tmp_path / "ok")
    write(data / "valid.en", "one\ntwo\nthree\n")
    with pytest.raises(DataError, match=r"valid.de has 2 lines but .*valid.en has 3"):
        nmt_data.load_corpus(str(data))
    write(data / "valid.en", "a\nb\n")
    write(data / "test.de", b"gut\n\xff\xfe kaputt\n", mode="wb")
    with pytest.raises(DataError, match=r"test.de: line 2 is not valid UTF-8"):
        nmt_data.load_corpus(str(data))
    write(data / "test.de", b"\x00\x01\x02binary", mode="wb")
    with pytest.raises(DataError, match="looks binary"):
        nmt_data.load_corpus(str(data))
    os.remove(data / "test.de")
    with pytest.raises(DataError, match="test.de: file not found"):
        nmt_data.load_corpus(str(data))
    os.mkdir(data / "test.de")
    with pytest.raises(DataError, match="is a directory"):
        nmt_data.load_corpus(str(data))
    empty = fairseq_dir(tmp_path / "empty")
    write(empty / "train.de", "\n\n")
    write(empty / "train.en", "")
    with pytest.raises(DataError, match="are empty; the train split needs sentence pairs"):
        nmt_data.load_corpus(str(empty))
    with pytest.raises(DataError, match="not a directory"):
        nmt_data.load_corpus(str(tmp_path / "missing"))


def test_ding_dictionary_parsing(tmp_path):
    path = write(tmp_path / "de-en", "\n".join([
        "# Version :: devel",
        "Aal {m} :: eel",
        "Hund {m} | Der Hund bellt laut. | Er hat einen Hund. :: dog | The dog barks loudly. | He has a dog.",
        "Ich komme morgen. [ugs.]; Ich komme bald. :: I'm coming tomorrow.; I'll come soon.",
        "Nicht gleich | Zwei Teile hier. :: not aligned",
        "kleine Sätze sind. :: small sentences are.",
    ]) + "\n")
    assert nmt_data.ding_pairs(str(path)) == [
        ("Der Hund bellt laut.", "The dog barks loudly."), ("Er hat einen Hund.", "He has a dog."),
        ("Ich komme morgen.", "I'm coming tomorrow."),
    ]


def test_synthetic_corpus_is_deterministic_and_labelled(tmp_path):
    a = nmt_data.load_corpus(corpus="synthetic", seed=3)
    b = nmt_data.load_corpus(corpus="synthetic", seed=3)
    assert a.name == "synthetic-de-en" and "SYNTHETIC" in a.description
    assert a.splits == b.splits
    assert {k: len(v) for k, v in a.splits.items()} == {"valid": 1000, "test": 1000, "train": 20000}
    assert not set(a.splits["train"]) & set(a.splits["test"])
    with pytest.raises(DataError, match="pass --data-dir"):
        nmt_data.load_corpus(src="fr", tgt="en")
    with pytest.raises(DataError, match="install Debian's trans-de-en .* or choose --corpus multi30k"):
        nmt_data.load_corpus(corpus="ding", ding_path=str(tmp_path / "no-dictionary"))
    with pytest.raises(DataError, match="--corpus wiki: unknown; choose from multi30k, ding, synthetic"):
        nmt_data.load_corpus(corpus="wiki")


def test_synthetic_grammar_has_german_word_order():
    pairs = synthetic.synthetic_pairs(count=3000, seed=5)
    assert len(pairs) == len(set(pairs)) == 3000
    assert pairs == synthetic.synthetic_pairs(count=3000, seed=5)
    german = [de for de, _ in pairs]
    # Verb-final subordinate clauses and verb-second after a fronted adverbial occur.
    assert any(", weil " in s and s.rstrip(".").split()[-1] in {"sieht", "kauft", "hat", "mag", "schläft", "lacht"}
               for s in german)
    assert any(s.startswith("Heute ") and s.split()[1] in {"sieht", "kauft", "mag", "hat", "schläft", "gibt"}
               for s in german)
    assert any(" den " in s for s in german) and any(" dem " in s for s in german)  # case and gender
    assert "müdee" not in " ".join(german)


def test_sentencepiece_vocabulary_round_trip_and_cache(tmp_path):
    pairs = synthetic.synthetic_pairs(count=500, seed=1)
    vocab = nmt_data.build_vocabulary(pairs, 300, str(tmp_path))
    assert 16 < vocab.size <= 300
    de, en = pairs[0]
    ids = vocab.encode(de)
    assert PAD not in ids and EOS not in ids
    assert vocab.decode(ids + [EOS, 7, 8]) == de
    assert len(os.listdir(tmp_path)) == 1
    again = nmt_data.build_vocabulary(pairs, 300, str(tmp_path))  # loaded from the cache
    assert again.encode(en) == vocab.encode(en)
    with pytest.raises(DataError, match="too small"):
        nmt_data.build_vocabulary(pairs, 4, str(tmp_path))


def test_bpe_split_data_keeps_tokens_and_removes_markers(tmp_path):
    data = fairseq_dir(tmp_path, pairs=(("ein hun@@ d .", "a do@@ g ."), ("zwei kat@@ zen .", "two cats .")))
    corpus = nmt_data.load_corpus(str(data))
    assert corpus.bpe_split
    vocab = nmt_data.build_vocabulary(corpus.splits["train"], 100, str(tmp_path / "cache"), bpe_split=True)
    ids = vocab.encode("a do@@ g .")
    assert nmt_data.UNK not in ids
    assert vocab.decode(ids) == "a dog ."
    assert vocab.encode("unseen")[0] == nmt_data.UNK


def iwslt_lengths(count, seed=0):
    """IWSLT14-like BPE lengths: sources (with EOS) lognormal around 25 tokens, up to 175; targets about
    as long (15 % apart)."""
    rng = np.random.default_rng(seed)
    source = np.clip(np.round(rng.lognormal(np.log(22), 0.55, count)), 2, 175).astype(int)
    target = np.clip(np.round(source * rng.normal(1.0, 0.15, count)), 1, 175).astype(int)
    return source, target


def iwslt_like(count, seed=0):
    """Examples of `iwslt_lengths` with random token ids, so that every example is told apart."""
    rng = np.random.default_rng(seed)
    return [(list(rng.integers(3, 1000, s - 1)) + [EOS], list(rng.integers(3, 1000, t)))
            for s, t in zip(*iwslt_lengths(count, seed))]


def contents(batches):
    """The (source, target) pairs that `make_batches`' batches hold, from their arrays."""
    pairs = []
    for inputs, labels in batches:
        for src, lab in zip(inputs["source_ids"], labels):
            if (lab != PAD).any():
                pairs.append((tuple(src[src != PAD]), tuple(lab[lab != PAD][:-1])))
    return pairs


def test_batches_are_length_sorted_and_filled_up_to_max_tokens():
    examples = iwslt_like(3000)
    batches = nmt_data.make_batches(examples, max_tokens=1024, seed=4)
    shapes = {b[0]["source_ids"].shape for b in batches}
    assert {length for _, length in shapes} <= set(nmt_data.LENGTH_GRID)
    assert all(rows == 1024 // length for rows, length in shapes)  # rows x L <= max_tokens, one shape a length
    assert sorted(contents(batches)) == sorted((tuple(s), tuple(t)) for s, t in examples)  # each once
    empty_rows = [int(((labels != PAD).sum(1) == 0).sum()) for _, labels in batches]
    assert sum(1 for n in empty_rows if n) <= 1  # only the last batch is filled up with empty rows
    for inputs, labels in batches:
        src, dec = inputs["source_ids"], inputs["decoder_input_ids"]
        assert src.shape == dec.shape == labels.shape
        real = labels != PAD
        assert (dec[real.any(1), 0] == EOS).all()  # decoder input starts with EOS
        for row in np.flatnonzero(real.any(1)):  # labels are decoder inputs shifted left, ending in EOS
            n = real[row].sum()
            assert labels[row, n - 1] == EOS and (dec[row, 1:n] == labels[row, :n - 1]).all()
    with pytest.raises(DataError, match="--max-tokens 4 is too small"):
        nmt_data.make_batches(examples, max_tokens=4)


def test_batches_are_deterministic_per_seed_and_differ_across_seeds():
    examples = iwslt_like(2000, seed=1)
    first, again = (nmt_data.make_batches(examples, 1024, seed=4) for _ in range(2))
    assert all((a[1] == b[1]).all() and (a[0]["source_ids"] == b[0]["source_ids"]).all() for a, b in zip(first, again))
    other = nmt_data.make_batches(examples, 1024, seed=5)
    assert len(other) == len(first)  # the number of updates an epoch does not depend on the seed
    assert any(a[1].shape != b[1].shape or (a[1] != b[1]).any() for a, b in zip(first, other))
    # Ties in length are broken by the seed: batches of one shape hold other examples, not just another order.
    same_shape = lambda batches: sorted(sorted(map(tuple, b[1])) for b in batches if b[1].shape == first[0][1].shape)  # noqa: E731
    assert same_shape(first) != same_shape(other)
    # Without a seed: consecutive runs of the length-sorted examples, from short to long.
    lengths = [max(len(s), len(t) + 1) for s, t in contents(nmt_data.make_batches(examples, 1024))]
    assert lengths == sorted(lengths) and len(lengths) == len(examples)


def test_fill_of_iwslt_like_batches_at_4096_tokens():
    """IWSLT14's 160,239 pairs, IWSLT-like lengths: fill = num_tokens / padded tokens >= 0.95 with a
    bounded number of shapes, where the coarse buckets used before wasted a quarter."""
    examples = [([3] * (s - 1) + [EOS], [3] * t) for s, t in zip(*iwslt_lengths(160239))]
    stats = nmt_data.batch_stats(examples, 4096)
    assert stats["fill"] >= 0.95 and stats["budget"] >= 0.99
    assert stats["source_fill"] <= stats["fill"] and stats["target_fill"] <= stats["fill"]
    assert stats["shapes"] <= len(nmt_data.LENGTH_GRID) == 45
    before = nmt_data.batch_stats(examples, 4096, nmt_data.BUCKETS, carry=False)
    assert before["fill"] < 0.8 and before["batches"] > 1.2 * stats["batches"]
    assert stats["batches"] < nmt_data.fairseq_batch_count(examples, 4096)[0]
    few = examples[:3000]
    assert nmt_data.batch_stats(few, 4096)["batches"] == len(nmt_data.make_batches(few, 4096, seed=0))


def test_fairseq_batch_count_keeps_multiples_of_8_rows():
    """fairseq's batch_by_size: 20 examples of 10 tokens at 100 tokens a batch: a batch grows to 10 rows,
    keeps 8 (--required-batch-size-multiple 8) and carries 2 on: batches of 8, 8 and 4."""
    examples = [([5] * 9 + [EOS], [5] * 9)] * 20
    assert nmt_data.fairseq_batch_count(examples, 100) == (3, 1.0)
    # Ten of 10 tokens and one of 20: 8 rows of 10, then 2 of 10 and the 20 in a batch of 3 x 20 tokens.
    assert nmt_data.fairseq_batch_count(examples[:10] + [([5] * 19 + [EOS], [5])], 100) == (2, round(120 / 140, 4))


def test_length_grid_steps_by_at_most_ten_percent():
    grid = nmt_data.LENGTH_GRID
    assert grid[0] == 1 and grid[-1] == nmt_data.BUCKETS[-1] and list(grid) == sorted(set(grid))
    assert all(b - a == 1 or b <= 1.1 * a + 0.5 for a, b in zip(grid, grid[1:]))


def packed_contents(batches):
    """The (source, target) pairs of `pack_batches`' batches, read back by segment, each checked: its
    positions count from 0, its decoder input is EOS + target and its labels target + EOS."""
    pairs = []
    for inputs, labels in batches:
        for r in range(labels.shape[0]):
            src_seg, dec_seg = inputs["source_segments"][r], inputs["decoder_segments"][r]
            assert (inputs["source_ids"][r][src_seg == 0] == PAD).all() and (labels[r][dec_seg == 0] == PAD).all()
            for k in range(1, int(src_seg.max(initial=0)) + 1):
                src, dec = inputs["source_ids"][r][src_seg == k], inputs["decoder_input_ids"][r][dec_seg == k]
                lab = labels[r][dec_seg == k]
                assert (inputs["source_positions"][r][src_seg == k] == np.arange(len(src))).all()
                assert (inputs["decoder_positions"][r][dec_seg == k] == np.arange(len(dec))).all()
                assert dec[0] == EOS and lab[-1] == EOS and (dec[1:] == lab[:-1]).all()
                pairs.append((tuple(src), tuple(lab[:-1])))
            assert dec_seg.max(initial=0) == src_seg.max(initial=0)  # pair k: source k and target k, one row
    return pairs


def test_packed_batches_hold_every_pair_once_in_one_shape():
    examples = iwslt_like(3000)
    batches = nmt_data.pack_batches(examples, max_tokens=1024, seed=4)
    length = nmt_data.pack_length(examples)
    assert length == min(b for b in nmt_data.BUCKETS if b >= nmt_data.num_tokens(examples).max())
    assert {b[0]["source_ids"].shape for b in batches} == {(1024 // length, length)}  # rows x L <= max_tokens
    assert sorted(packed_contents(batches)) == sorted((tuple(s), tuple(t)) for s, t in examples)  # each once
    again, other = nmt_data.pack_batches(examples, 1024, seed=4), nmt_data.pack_batches(examples, 1024, seed=5)
    assert all((a[1] == b[1]).all() for a, b in zip(batches, again))  # the same seed, the same batches
    assert len(other) == len(batches) and any((a[1] != b[1]).any() for a, b in zip(batches, other))
    stats = nmt_data.packed_stats(examples, 1024)
    assert stats["batches"] == len(batches) and stats["rows"] == 1024 // length
    grid = nmt_data.batch_stats(examples, 1024)
    assert stats["source_fill"] > grid["source_fill"] and stats["target_fill"] > grid["target_fill"]
    with pytest.raises(DataError, match="--max-tokens 4 is too small"):
        nmt_data.pack_batches(examples, max_tokens=4)


def test_pack_rows_best_fit_decreasing():
    """Rows of 10 tokens a side; pairs (source, target): (3, 7), (6, 6), (2, 2), (11, 2). Longest first:
    (11, 2) fits no row and is left out; (3, 7) opens row 0 (free (7, 3)); (6, 6) does not fit there and
    opens row 1 (free (4, 4)); (2, 2) fits both and goes where less is left over: row 1 (2 + 2 against
    5 + 1)."""
    assert nmt_data.pack_rows([3, 6, 2, 11], [7, 6, 2, 2], 10) == [[0], [1, 2]]
    assert nmt_data.pack_rows([3, 6, 2, 5], [7, 6, 2, 3], 10) == [[0, 3], [1, 2]]  # (5, 3) fills row 0's (7, 3)
