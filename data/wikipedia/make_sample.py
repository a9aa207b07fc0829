"""Make enwiki-sample.txt.bz2, the default corpus of pretrain_bert.py, from gensim's Wikipedia test dump.

    pip install gensim==4.4.0
    python data/wikipedia/make_sample.py      # rewrites data/wikipedia/enwiki-sample.txt.bz2

The source is the English Wikipedia sample inside the gensim 4.4.0 wheel,
`gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2` (a shortened
Wikipedia XML dump). gensim's `extract_pages` reads the pages and `filter_wiki` strips the markup; then
the filters and sentence splitter below make one document per article. The output is BERT's format (one
sentence a line, a blank line between documents), UTF-8, bz2-compressed; harness/bert_data.py reads it
with `read_corpus`. Only this script needs gensim; the project does not.
"""

import bz2
import os
import re
import sys

import gensim
from gensim.corpora.wikicorpus import extract_pages, filter_wiki

GENSIM_WIKI = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
OUTPUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "enwiki-sample.txt.bz2")

_MARKUP = re.compile(r"'{2,}")                       # ''italic'' and '''bold''' left by filter_wiki
_EMPTY_BRACKETS = re.compile(r"\s*\(\s*[,;]?\s*\)")  # "Albedo () or ...": a template filter_wiki removed
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_NOT_PROSE = tuple("=*#:;|!{}+<")                     # headings, lists, indents, tables


def split_sentences(paragraph):
    """A simple regex sentence splitter: a break after . ! ? followed by a capital or a digit."""
    return [s.strip() for s in _SENTENCE_BREAK.split(paragraph) if s.strip()]


def wiki_documents(path, min_words=8):
    """One document per article of a Wikipedia XML dump (.bz2), as lists of sentences.

    gensim's `extract_pages` reads the pages and `filter_wiki` removes links, templates, tables and
    references; then headings, lists and short lines (captions, table cells) are dropped: a paragraph
    is a line of at least `min_words` words. Redirects and stubs end up empty and are left out.
    """
    documents = []
    with bz2.open(path) as dump:
        for _title, text, _page_id in extract_pages(dump):
            sentences = []
            for line in _MARKUP.sub("", filter_wiki(text)).splitlines():
                line = _EMPTY_BRACKETS.sub("", line).strip()
                if line and not line.startswith(_NOT_PROSE) and len(line.split()) >= min_words:
                    sentences += split_sentences(line)
            if sentences:
                documents.append(sentences)
    return documents


def main():
    source = os.path.join(os.path.dirname(gensim.__file__), GENSIM_WIKI)
    if not os.path.isfile(source):
        sys.exit(f"gensim {gensim.__version__} has no {GENSIM_WIKI}; pip install gensim==4.4.0")
    documents = wiki_documents(source)
    text = "\n\n".join("\n".join(document) for document in documents) + "\n"
    with open(OUTPUT, "wb") as f:
        f.write(bz2.compress(text.encode("utf-8"), 9))
    print(f"{OUTPUT}: {len(documents)} documents, {sum(map(len, documents))} sentences, "
          f"{os.path.getsize(OUTPUT):,} bytes (gensim {gensim.__version__})")


if __name__ == "__main__":
    main()
