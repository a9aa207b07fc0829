"""harness/bert_data.py: the default BERT corpus shipped in data/wikipedia, and compressed --corpus files."""

import bz2
import gzip
import os

import pytest

from harness import bert_data
from harness.console import DataError

TEXT = "First sentence.\nSecond sentence.\n\nAnother document.\n"


def test_the_default_corpus_is_the_wikipedia_sample_shipped_in_the_project(monkeypatch):
    """data/wikipedia/enwiki-sample.txt.bz2 (offline: sockets are refused), with its documented sizes."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    documents, description = bert_data.load_corpus()
    assert description == "English Wikipedia sample (data/wikipedia, 103 articles)"
    assert len(documents) == 103 and sum(map(len, documents)) == 19303
    assert documents[0][0].startswith("Anarchism is a political philosophy")
    assert documents == bert_data.read_corpus([bert_data.WIKI_SAMPLE])  # the same reader as --corpus
    readme = open(os.path.join(os.path.dirname(os.path.dirname(bert_data.WIKI_SAMPLE)), "README.md"),
                  encoding="utf-8").read()
    assert "CC BY-SA" in readme and "GFDL" in readme and "make_sample.py" in readme  # source and terms


@pytest.mark.parametrize("name, compress", [("docs.txt.gz", gzip.compress), ("docs.txt.bz2", bz2.compress)])
def test_compressed_corpus_files_read_like_plain_ones(name, compress, tmp_path):
    (tmp_path / "docs.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / name).write_bytes(compress(TEXT.replace("\n", "\r\n").encode("utf-8-sig")))
    plain, packed = (bert_data.read_corpus([str(tmp_path / n)]) for n in ("docs.txt", name))
    assert packed == plain == [["First sentence.", "Second sentence."], ["Another document."]]


@pytest.mark.parametrize("content, message", [
    (b"not bzip2 at all", "cannot be decompressed"),
    (bz2.compress(TEXT.encode())[:-8], "cannot be decompressed"),
    (bz2.compress(b"fine\n\xff\xfe broken\n"), "line 2 is not valid UTF-8"),
    (bz2.compress(b"a\0b\n"), "looks binary"),
])
def test_a_bad_bz2_corpus_file_is_a_data_error(content, message, tmp_path):
    (tmp_path / "bad.txt.bz2").write_bytes(content)
    with pytest.raises(DataError, match=message):
        bert_data.read_corpus([str(tmp_path / "bad.txt.bz2")])


def test_the_finetune_flags_choices_are_the_glue_tasks_read():
    from harness.specs import GLUE_TASK_NAMES

    assert tuple(bert_data.GLUE_TASKS) == GLUE_TASK_NAMES
