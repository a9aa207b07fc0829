"""harness/wmt14.py: prepare-wmt14en2de.sh reproduced on tiny archives with the member names of the WMT releases."""

import io
import os
import tarfile

import pytest
import regex
from sacremoses import MosesPunctNormalizer, MosesTokenizer

import train_nmt
from harness import nmt_data, nmt_job, translate, wmt14
from reproduction import experiments
from harness.devices import lr_at
from harness.console import DataError

SUBJECTS = [("The committee", "Der Ausschuss"), ("Our government", "Unsere Regierung"),
            ("The council", "Der Rat"), ("This well-known report", "Dieser wohlbekannte Bericht")]
VERBS = [("discusses", "erörtert"), ("supports", "unterstützt"), ("rejects", "lehnt ab")]
OBJECTS = [("the new proposal.", "den neuen Vorschlag."), ("the budget for 2014.", "den Haushalt für 2014."),
           ("the European treaty.", "den europäischen Vertrag.")]


def sentences(prefix_en, prefix_de, count):
    """`count` aligned (en, de) sentences, each corpus with its own opening words."""
    rows = [(f"{prefix_en} {s[0].lower()} {v[0]} {o[0]}", f"{prefix_de} {s[1].lower()} {v[1]} {o[1]}")
            for s in SUBJECTS for v in VERBS for o in OBJECTS]
    return rows[:count]


EUROPARL = sentences("Yesterday", "Gestern", 34) + [
    ("He said: “That's good.”", "Er sagte: „Das ist gut.“"),  # curly quotes: normalize-punctuation
    ("Zero\u200bwidth and\ttab.", "Null\u200bbreite und\tTab."),  # category C: remove-non-printing-char
]
BAD_RATIO = ("Yes.", "Ja, natürlich, das ist absolut richtig, und wir wissen das alle sehr genau.")
TOO_LONG = (" ".join(["The committee supports the new proposal."] * 45),
            " ".join(["Der Ausschuss unterstützt den neuen Vorschlag."] * 45))  # 270 words a side
COMMONCRAWL = sentences("Today", "Heute", 30)[:15] + [BAD_RATIO] + sentences("Today", "Heute", 30)[15:] + [
    TOO_LONG, ("", "")]
NEWS = sentences("Tomorrow", "Morgen", 36)
TEST_SEGS = [("The committee supports the proposal.", "Der Ausschuss unterstützt den Vorschlag."),
             ("  It’s a well-known fact.  ", " Es ist eine wohlbekannte Tatsache. ")]
DEV = [("The council rejects the budget.", "Der Rat lehnt den Haushalt ab."),
       ("It’s the treaty.", "Es ist der Vertrag.")]
LANGS = ("en", "de")
OUTPUTS = {f"{split}.{lang}" for split in ("train", "valid", "test") for lang in LANGS} | {"code"}


def text(rows, side):
    return ("\n".join(row[side] for row in rows) + "\n").encode("utf-8")


def sgm(kind, lang, side):
    lines = ['<srcset setid="newstest2014" srclang="any">', '<doc sysid="ref" docid="1" genre="news" origlang="en">',
             "<p>"] + [f'<seg id="{i}">{pair[side]}</seg>' for i, pair in enumerate(TEST_SEGS, 1)]
    return ("\n".join(lines + ["</p>", "</doc>", "</srcset>"]) + "\n").encode("utf-8")


def releases():
    """{archive name: {member: bytes}}: the five archives of the script, each with one extra pair it does not read."""
    return {
        "training-parallel-europarl-v7.tgz": {f"training/europarl-v7.de-en.{lang}": text(EUROPARL, side)
                                              for side, lang in enumerate(LANGS)} | {
            "training/europarl-v7.fr-en.en": b"Not read.\n"},
        "training-parallel-commoncrawl.tgz": {f"commoncrawl.de-en.{lang}": text(COMMONCRAWL, side)
                                              for side, lang in enumerate(LANGS)} | {"commoncrawl.fr-en.fr": b"Non.\n"},
        "training-parallel-nc-v9.tgz": {f"./training/news-commentary-v9.de-en.{lang}": text(NEWS, side)
                                        for side, lang in enumerate(LANGS)},
        "test-full.tgz": {f"test-full/newstest2014-deen-{kind}.{lang}.sgm": sgm(kind, lang, side)
                          for kind in ("src", "ref") for side, lang in enumerate(LANGS)},
        "dev.tgz": {f"dev/newstest2013.{lang}": text(DEV, side) for side, lang in enumerate(LANGS)} | {
            "dev/newstest2012.en": b"Not read.\n"},
    }


def make_archives(folder, **changes):
    """The archives in `folder`; changes map an archive to {member: bytes or None (dropped)}, or to None."""
    folder.mkdir(parents=True, exist_ok=True)
    for archive, members in releases().items():
        change = changes.get(archive.replace("-", "_").replace(".", "_"), {})
        if change is None:
            continue
        members = {name: data for name, data in {**members, **change}.items() if data is not None}
        with tarfile.open(folder / archive, "w:gz") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return folder


def oracle(lines, lang, normalize=True):
    """normalize-punctuation | remove-non-printing-char | tokenizer -a, through sacremoses directly."""
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang, perl_parity=True), MosesTokenizer(lang=lang)
    if normalize:
        lines = [regex.sub(r"\p{C}", " ", normalizer.normalize(line)) for line in lines]
    return [tokenizer.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=True) for line in lines]


def read(out, name):
    return (out / name).read_text(encoding="utf-8").split("\n")[:-1]


def unbpe(out, name):
    return [line.replace("@@ ", "") for line in read(out, name)]


def quiet(message):
    pass


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    return make_archives(tmp_path_factory.mktemp("wmt14") / "orig")


@pytest.fixture(scope="module")
def prepared(archives):
    """Both validation choices: the script's split and the paper's newstest2013."""
    messages = []
    runs = {valid: (archives.parent / valid, wmt14.prepare_wmt14(archives, archives.parent / valid, valid=valid,
                                                                 workers=1, log=messages.append))
            for valid in wmt14.VALID_CHOICES}
    return runs, messages


def training_rows():
    """The raw training pairs in the script's order, and the cleaned ones (planted bad and blank pairs gone)."""
    raw = EUROPARL + COMMONCRAWL + NEWS
    return raw, [pair for pair in raw if pair not in (BAD_RATIO, TOO_LONG, ("", ""))]


def test_layout_and_line_counts(prepared):
    runs, messages = prepared
    for valid, (out, summary) in runs.items():
        assert set(os.listdir(out)) == OUTPUTS, valid  # no temp files left
        for split in ("train", "valid", "test"):
            assert len(read(out, f"{split}.en")) == len(read(out, f"{split}.de")) == summary[split] > 0
        assert summary["news_commentary"] == "v9" and summary["valid_set"] == valid
        assert read(out, "code")[0] == "#version: 0.2" and len(read(out, "code")) == summary["bpe_merges"] + 1
        assert 0 < summary["bpe_merges"] < 40000  # subword-nmt stops early on a tiny corpus
    raw, clean = training_rows()
    assert runs["split"][1]["valid"] == 1 and runs["split"][1]["train"] == len(clean) - 1
    assert runs["newstest2013"][1]["valid"] == len(DEV) and runs["newstest2013"][1]["train"] == len(clean)
    assert any("clean-corpus kept" in m for m in messages)


def test_train_is_normalized_tokenized_cleaned_and_split_every_100th(prepared):
    runs, _ = prepared
    raw, clean = training_rows()
    expected = [oracle([pair[side] for pair in raw], lang) for side, lang in enumerate(LANGS)]
    tokenized = list(zip(*expected))
    kept = [tokenized[i] for i, pair in enumerate(raw) if pair in clean]
    split_out, newstest_out = runs["split"][0], runs["newstest2013"][0]
    for side, lang in enumerate(LANGS):
        # split: valid is the 100th raw line (before cleaning), train the other lines that survive cleaning
        assert unbpe(split_out, f"valid.{lang}") == [tokenized[99][side]]
        assert unbpe(split_out, f"train.{lang}") == [row[side] for row in kept if row != tokenized[99]]
        assert unbpe(newstest_out, f"train.{lang}") == [row[side] for row in kept]
    train_en, train_de = unbpe(newstest_out, "train.en"), unbpe(newstest_out, "train.de")
    assert 'He said : &quot; That &apos;s good . &quot;' in train_en  # “ ” -> " (normalized), then escaped
    assert "Er sagte : &quot; Das ist gut . &quot;" in train_de
    assert "Zero width and tab ." in train_en and "Null breite und Tab ." in train_de  # \u200b, \t -> space
    assert "Yesterday this well @-@ known report supports the new proposal ." in train_en  # tokenizer -a
    assert train_en[0].startswith("Yesterday the committee") and train_de[-1].startswith("Morgen")  # cased
    everything = train_en + train_de
    assert not any(line.startswith("Yes .") or "absolut richtig" in line for line in everything)  # ratio > 1.5
    assert max(len(line.split()) for line in read(newstest_out, "train.en")) <= 250 and "" not in everything


def test_test_set_is_stripped_sgml_and_valid_is_newstest2013(prepared):
    runs, _ = prepared
    for out, _ in runs.values():
        for side, lang in enumerate(LANGS):
            segs = [pair[side].strip().replace("’", "'") for pair in TEST_SEGS]
            assert unbpe(out, f"test.{lang}") == oracle(segs, lang, normalize=False)
    test_en = unbpe(runs["split"][0], "test.en")
    assert test_en[1] == "It &apos;s a well @-@ known fact ."
    assert not any("<" in line or "seg" in line for line in test_en + unbpe(runs["split"][0], "test.de"))
    out = runs["newstest2013"][0]
    for side, lang in enumerate(LANGS):
        assert unbpe(out, f"valid.{lang}") == oracle([pair[side].replace("’", "'") for pair in DEV], lang,
                                                     normalize=False)


def test_bpe_is_joint_and_applied_everywhere(prepared, archives, tmp_path):
    runs, _ = prepared
    out = runs["newstest2013"][0]
    assert any("@@ " in line for line in read(out, "train.en")) and any("@@ " in line for line in read(out, "train.de"))
    assert not any(line.endswith("@@") for name in OUTPUTS - {"code"} for line in read(out, name))
    none = wmt14.prepare_wmt14(archives, tmp_path / "none", bpe_merges=0, valid="newstest2013", workers=1, log=quiet)
    assert none["bpe_merges"] == 0 and read(tmp_path / "none", "train.de") == unbpe(out, "train.de")


def test_translate_prepares_input_as_the_corpus_was(prepared):
    """--translate on a WMT14 run: cased, hyphens split (-a), BPE; an IWSLT14-like lowercased vocabulary lowercases."""
    out = prepared[0]["newstest2013"][0]
    codes = (out / "code").read_text(encoding="utf-8")
    tokens = sorted({t for name in ("train.en", "train.de") for line in read(out, name) for t in line.split()})
    prepare, finish = translate.text_codec(nmt_data.Vocabulary(tokens=["<pad>", "</s>", "<unk>"] + tokens), codes,
                                          "en", "de")
    line = prepare("Yesterday this well-known report supports the new proposal.")
    assert line.replace("@@ ", "") == "Yesterday this well @-@ known report supports the new proposal ."
    assert finish("Der Bericht ist wohl @-@ bekannt .") == "Der Bericht ist wohl-bekannt."
    lowercased = nmt_data.Vocabulary(tokens=sorted({t.lower() for t in tokens} - {"@-@"}))
    prepare, _ = translate.text_codec(lowercased, codes, "en", "de")
    assert prepare("The well-known report.").replace("@@ ", "") == "the well-known report ."


def test_workers_give_the_same_files(prepared, archives, tmp_path, monkeypatch):
    monkeypatch.setattr(wmt14, "CHUNK_LINES", 16)  # several tokenization jobs, in two processes
    wmt14.prepare_wmt14(archives, tmp_path / "two", valid="split", workers=2, log=quiet)
    for name in OUTPUTS:
        assert (tmp_path / "two" / name).read_bytes() == (prepared[0]["split"][0] / name).read_bytes(), name


def test_news_commentary_v12_is_the_scripts_default_release(tmp_path):
    v9 = releases()["training-parallel-nc-v9.tgz"]
    v12 = {name.replace("v9", "v12")[2:]: data for name, data in v9.items()}
    folder = make_archives(tmp_path / "orig", training_parallel_nc_v9_tgz=None)
    with tarfile.open(folder / "training-parallel-nc-v12.tgz", "w:gz") as tar:
        for name, data in v12.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    summary = wmt14.prepare_wmt14(folder, tmp_path / "out", bpe_merges=10, workers=1, log=quiet)
    assert summary["news_commentary"] == "v12" and unbpe(tmp_path / "out", "train.en")[-1].startswith("Tomorrow")


TRAIN_EN = "training/europarl-v7.de-en.en"
BAD = {  # name: (changes to the archives, valid, words the message must contain)
    "missing archive": (dict(training_parallel_commoncrawl_tgz=None), "split",
                        ["training-parallel-commoncrawl.tgz: archive not found", "statmt.org"]),
    "missing test archive": (dict(test_full_tgz=None), "split", ["test-full.tgz: archive not found"]),
    "missing dev archive": (dict(dev_tgz=None), "newstest2013", ["dev.tgz: archive not found"]),
    "no news commentary": (dict(training_parallel_nc_v9_tgz=None), "split", ["training-parallel-nc-v9.tgz"]),
    "missing member": (dict(training_parallel_europarl_v7_tgz={TRAIN_EN: None}), "split",
                       [TRAIN_EN, "missing", "download"]),
    "missing sgm": (dict(test_full_tgz={"test-full/newstest2014-deen-ref.de.sgm": None}), "split",
                    ["test-full/newstest2014-deen-ref.de.sgm", "missing"]),
    "misaligned": (dict(training_parallel_europarl_v7_tgz={TRAIN_EN: text(EUROPARL[:-1], 0)}), "split",
                   ["europarl-v7.de-en.en has 35 lines but", "has 36"]),
    "not utf-8": (dict(training_parallel_commoncrawl_tgz={"commoncrawl.de-en.de": b"Gr\xfc\xdfe\n"}), "split",
                  ["commoncrawl.de-en.de line 1 is not valid UTF-8"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_archives_raise_data_error_and_write_nothing(tmp_path, case):
    changes, valid, words = BAD[case]
    folder = make_archives(tmp_path / "orig", **changes)
    with pytest.raises(DataError) as error:
        wmt14.prepare_wmt14(folder, tmp_path / "out", valid=valid, workers=1, log=quiet)
    for word in words:
        assert word in str(error.value), (word, str(error.value))
    assert "\n" not in str(error.value) and not (tmp_path / "out").exists()


def test_corrupt_archive_and_bad_arguments(tmp_path):
    folder = make_archives(tmp_path / "orig")
    (folder / "dev.tgz").write_bytes(b"not an archive")
    with pytest.raises(DataError, match="dev.tgz: cannot be read as a gzip-compressed tar archive"):
        wmt14.prepare_wmt14(folder, tmp_path / "out", valid="newstest2013", workers=1, log=quiet)
    for kwargs in (dict(valid="newstest2012"), dict(bpe_merges=-1), dict(news_commentary="v10")):
        with pytest.raises(DataError):
            wmt14.prepare_wmt14(folder, tmp_path / "out", workers=1, log=quiet, **kwargs)
    with pytest.raises(DataError, match="not a directory"):
        wmt14.prepare_wmt14(tmp_path / "nowhere", tmp_path / "out", log=quiet)
    assert not (tmp_path / "out").exists()


def test_preset_is_the_papers_base_model_en_to_de():
    args = train_nmt.parse_args(["--preset", "wmt14"])
    sizes = (args.d_model, args.ffn_dim, args.heads, args.encoder_layers, args.decoder_layers, args.dropout)
    assert sizes == (512, 2048, 8, 6, 6, 0.1)  # Transformer base (Appendix A)
    assert (args.lr, args.warmup_steps, args.decay_epoch, args.weight_decay, args.max_tokens) == (7e-4, 4000, 6, 0.0, 4096)
    assert (args.src, args.tgt) == ("en", "de")
    assert args.schedule == "inverse_sqrt"  # Post-LN: warmup 4000, then inverse sqrt
    pre = train_nmt.parse_args(["--preset", "wmt14", "--no-warmup"])  # Section 4: held to epoch 6, then inverse sqrt
    assert pre.schedule == "decay_then_inverse_sqrt" and pre.decay_factor == 1.0
    schedule = nmt_job.translation_schedule(pre, 100, 2000)
    assert lr_at(schedule, 0) == lr_at(schedule, 599) == pytest.approx(7e-4)
    assert lr_at(schedule, 2399) == pytest.approx(7e-4 * (600 / 2400) ** 0.5)
    flipped = train_nmt.parse_args(["--preset", "wmt14", "--src", "de", "--tgt", "en", "--lr", "1.5e-3"])
    assert (flipped.src, flipped.tgt, flipped.lr) == ("de", "en", 1.5e-3)  # explicit flags win
    assert (train_nmt.parse_args([]).src, train_nmt.parse_args(["--no-warmup"]).decay_factor) == ("de", 0.1)


def test_fig4_sweep_at_wmt14_is_section_4s_design():
    runs = experiments.sweep_runs("fig4", train_nmt.parse_args(["--preset", "wmt14"]))
    assert [run.name for run in runs] == ["post-warmup-lr7e-4", "pre-nowarmup-lr7e-4", "post-warmup-lr1.5e-3",
                                          "pre-nowarmup-lr1.5e-3"]
    assert (runs[3].spec.schedule, runs[3].spec.no_warmup, runs[3].spec.lr) == ("decay_then_inverse_sqrt", True, 1.5e-3)
    iwslt = experiments.sweep_runs("fig4", train_nmt.parse_args(["--preset", "iwslt"]))  # step decay, and RAdam runs
    assert len(iwslt) == 4 and iwslt[1].spec.schedule == "step" and iwslt[2].name == "post-radam-nowarmup"


def test_prepare_and_train_end_to_end(archives, tmp_path, capsys):
    data, out = tmp_path / "wmt14", tmp_path / "run"
    argv = ["--prepare-wmt14", str(archives), "--data-dir", str(data), "--preset", "tiny", "--src", "en",
            "--tgt", "de", "--out", str(out), "--max-updates", "2", "--warmup-steps", "1", "--beam", "1",
            "--max-tokens", "128", "--max-len-b", "20"]
    assert train_nmt.main(argv) == 0
    assert set(os.listdir(data)) == OUTPUTS and (out / "results.json").is_file()
    printed = capsys.readouterr().out
    assert "wmt14: wrote" in printed and f"{data} (en -> de)" in printed and "test BLEU" in printed


def test_prepare_needs_a_data_dir_and_english_german(archives, tmp_path, capsys):
    assert train_nmt.main(["--prepare-wmt14", str(archives), "--preset", "tiny", "--out", str(tmp_path / "o")]) == 2
    assert "--prepare-wmt14 needs --data-dir" in capsys.readouterr().err
    assert train_nmt.main(["--prepare-wmt14", str(archives), "--data-dir", str(tmp_path / "d"), "--preset", "tiny",
                           "--src", "fr", "--tgt", "en", "--out", str(tmp_path / "o")]) == 2
    assert "prepares English-German" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "d").exists()
