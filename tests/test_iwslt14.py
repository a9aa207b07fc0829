"""harness/iwslt14.py: prepare-iwslt14.sh reproduced on a tiny archive with the structure of the IWSLT14 release."""

import io
import os
import tarfile

import pytest
from sacremoses import MosesTokenizer

from harness import iwslt14
from harness.console import DataError

# Talk headers of train.tags.de-en.{de,en}: dropped (url, keywords, talkid) or kept without tags (title, description).
HEADERS = [
    ("<url>http://www.ted.com/talks/lang/de/anna_beispiel.html</url>",
     "<url>http://www.ted.com/talks/anna_beispiel.html</url>"),
    ("<keywords>talks, Meer, Wissenschaft</keywords>", "<keywords>talks, ocean, science</keywords>"),
    ("<talkid>1</talkid>", "<talkid>1</talkid>"),
    ("<title>Anna Beispiel: Über das Meer</title>", "<title>Anna Beispiel: About the ocean</title>"),
    ("<description>TED Talk Untertitel: Anna Beispiel spricht über das Meer.</description>",
     "<description>TED Talk Subtitles: Anna Beispiel talks about the ocean.</description>"),
]
TALK1 = [
    ("Hallo, Welt!", "Hello, world!"),
    ("Ich möchte Ihnen heute eine Geschichte erzählen.", "Today I want to tell you a story."),
    ("Es ist eine Geschichte über das Meer.", "It is a story about the sea."),
    ("Das Meer ist sehr groß und sehr tief.", "The sea is very big and very deep."),
    ("Wir wissen nur wenig über die Tiefsee.", "We know very little about the deep sea."),
    ("Vor zehn Jahren bin ich zum ersten Mal getaucht.", "Ten years ago I went diving for the first time."),
    ("Es war dunkel, kalt und sehr still.", "It was dark, cold and very quiet."),
    ("Dann sahen wir ein Licht.", "Then we saw a light."),
    ("Das Licht kam von einem kleinen Fisch.", "The light came from a small fish."),
    ('Er sagte: "Das ist gut."', 'He said: "That\'s good."'),
    ("Viele Tiere in der Tiefsee machen ihr eigenes Licht.", "Many animals in the deep sea make their own light."),
    ("Wissenschaftler nennen das Biolumineszenz.", "Scientists call this bioluminescence."),
    ("Warum machen sie das?", "Why do they do that?"),
    ("Manche wollen Beute anlocken, andere wollen sich verstecken.", "Some want to attract prey, others want to hide."),
    ("Das ist eine sehr alte Strategie.", "This is a very old strategy."),
    ("Wir haben Kameras gebaut, die im Dunkeln sehen können.", "We built cameras that can see in the dark."),
    ("Die Bilder waren unglaublich.", "The pictures were incredible."),
    ("Ich zeige Ihnen jetzt einige davon.", "I will now show you some of them."),
    ("Hier sehen Sie eine Qualle.", "Here you see a jellyfish."),
    ("Sie ist fast durchsichtig.", "It is almost transparent."),
    ("Und das hier ist ein Tintenfisch.", "And this here is a squid."),
    ("Er kann seine Farbe in einer Sekunde ändern.", "He can change his color in one second."),
    ("Das ist doch erstaunlich, oder?", "That is amazing, isn't it?"),
    ("Wir verstehen noch nicht, wie er das macht.", "We still do not understand how he does that."),
    ("Die Forschung kostet viel Geld und viel Zeit.", "The research costs a lot of money and a lot of time."),
    ("Aber sie lohnt sich.", "But it is worth it."),
    ("Jedes Jahr entdecken wir neue Arten.", "Every year we discover new species."),
    ("Manche sind winzig, manche sind riesig.", "Some are tiny, some are huge."),
    ("Im letzten Jahr fanden wir einen Wurm, der Knochen frisst.", "Last year we found a worm that eats bones."),
    ("Niemand hatte so etwas je gesehen.", "Nobody had ever seen anything like it."),
    ("Das Meer produziert die Hälfte unseres Sauerstoffs.", "The ocean produces half of our oxygen."),
    ("Jeder zweite Atemzug kommt aus dem Meer.", "Every second breath comes from the sea."),
    ("Trotzdem behandeln wir es wie einen Mülleimer.", "Nevertheless we treat it like a trash can."),
    ("Plastik findet man heute in jeder Tiefe.", "Today you find plastic at every depth."),
    ("Das müssen wir ändern.", "We have to change that."),
    ("Danke.", "Thank you."),  # 2 vs 3 words: ratio exactly 1.5 is kept
    ("Vielen Dank.", "Thanks a lot."),
]
TALK2 = [
    ("Ich bin Lehrerin in einer kleinen Stadt.", "I am a teacher in a small town."),
    ("Meine Schüler sind zwölf Jahre alt.", "My students are twelve years old."),
    ("Sie stellen jeden Tag neue Fragen.", "They ask new questions every day."),
    ("Warum ist der Himmel blau?", "Why is the sky blue?"),
    ("Warum ist das Meer salzig?", "Why is the sea salty?"),
    ("Ich weiß nicht immer die Antwort.", "I do not always know the answer."),
    ("Also suchen wir die Antwort zusammen.", "So we look for the answer together."),
    ("Das ist die beste Art zu lernen.", "That is the best way to learn."),
    ("Letztes Jahr haben wir ein kleines Boot gebaut.", "Last year we built a small boat."),
    ("Es war nicht schön, aber es schwamm.", "It was not pretty, but it floated."),
    ("Die Kinder waren sehr stolz.", "The children were very proud."),
    ("Die Eltern waren auch stolz.", "The parents were proud too."),
    ("Bildung ist mehr als Wissen.", "Education is more than knowledge."),
    ("Es geht um Neugier & Mut.", "It is about curiosity & courage."),
    ("Ich glaube, jedes Kind ist ein Forscher.", "I believe every child is a researcher."),
    ("Wir müssen ihnen nur Zeit geben.", "We just have to give them time."),
    ("Und wir müssen ihnen zuhören.", "And we have to listen to them."),
    ("Wenn wir unseren Kindern zeigen, dass Fragen wichtiger sind als schnelle Antworten, dass Fehler zum "
     "Lernen gehören und dass man mit anderen zusammen mehr erreicht als allein, dann werden sie eines Tages "
     "die Probleme lösen, die wir heute noch nicht einmal verstehen.",
     "If we show our children that questions matter more than quick answers, that mistakes are part of "
     "learning and that together with others you achieve more than alone, then one day they will solve the "
     "problems that we today do not even understand."),
    ("Das ist meine Hoffnung.", "That is my hope."),
    ("Danke schön.", "Thank you."),
    ("(Applaus)", "(Applause)"),
]
BAD_RATIO = ("Ja.", "Yes, of course, that is absolutely right.")  # 2 vs 9 words
TOO_LONG = (" ".join([TALK1[3][0]] * 20), " ".join([TALK1[3][1]] * 20))  # 180 words a side
TEST_SEGS = {  # in the order prepare-iwslt14.sh concatenates them
    "IWSLT14.TED.dev2010": [("Guten Morgen.", "Good morning."), ("Wie geht’s?", "How’s it going?")],
    "IWSLT14.TEDX.dev2012": [("Das ist ein Test.", "This is a test.")],
    "IWSLT14.TED.tst2010": [("Die Sonne scheint.", "The sun is shining."), ("   Es ist warm.  ", "  It is warm. ")],
    "IWSLT14.TED.tst2011": [("Wir gehen nach Hause.", "We are going home.")],
    "IWSLT14.TED.tst2012": [("Auf Wiedersehen!", "Goodbye!"), ("Bis morgen.", "See you tomorrow.")],
}
TEST_SETS = tuple(TEST_SEGS)
LANGS = ("de", "en")
OUTPUTS = {f"{split}.{lang}" for split in ("train", "valid", "test") for lang in LANGS} | {"code"}


def train_rows():
    """Raw train.tags lines as (de, en): two talks, with the bad pairs and a blank line mixed in."""
    return (HEADERS + TALK1[:20] + [BAD_RATIO] + TALK1[20:33] + [TOO_LONG] + TALK1[33:]
            + [(h[0].replace("Anna", "Berta"), h[1].replace("Anna", "Berta")) for h in HEADERS]
            + TALK2[:8] + [("", "")] + TALK2[8:])


def xml(name, lang, segs):
    side = LANGS.index(lang)
    lines = ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", f'<srcset setid="{name}" srclang="{lang}">',
             '<doc docid="535" genre="lectures">', "<url>http://www.ted.com/talks/x.html</url>",
             "<talkid>535</talkid>", "<title>Ein Titel</title>", "<description>Eine Beschreibung</description>"]
    lines += [f'<seg id="{i}"> {pair[side]} </seg>' for i, pair in enumerate(segs, 1)]
    return ("\n".join(lines + ["</doc>", "</srcset>", "</mteval>"]) + "\n").encode("utf-8")


def release_members():
    members = {"de-en/README": b"IWSLT 2014 release\n"}
    for name in reversed(TEST_SETS):  # archive order must not matter
        for lang in LANGS:
            members[f"de-en/{name}.de-en.{lang}.xml"] = xml(name, lang, TEST_SEGS[name])
    for side, lang in enumerate(LANGS):
        text = "\n".join(row[side] for row in train_rows()) + "\n"
        members[f"de-en/train.tags.de-en.{lang}"] = text.encode("utf-8")
    return members


def make_archive(path, members=None, **changes):
    """A gzip tar of `members` (default: the release above); changes map a member to new bytes, or None to drop."""
    members = dict(release_members() if members is None else members)
    for name, data in changes.items():
        members.pop(name, None) if data is None else members.__setitem__(name, data)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def oracle(lines, lang):
    """What tokenizer.perl -l lang | lowercase.perl gives, via sacremoses with the perl defaults."""
    tokenizer = MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(line, return_str=True, escape=True).lower() for line in lines]


def read(out, name):
    return (out / name).read_text(encoding="utf-8").split("\n")[:-1]


def unbpe(out, name):
    return [line.replace("@@ ", "") for line in read(out, name)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("iwslt14")
    messages = []
    summary = iwslt14.prepare_iwslt14(make_archive(root / "de-en.tgz"), root / "out", log=messages.append)
    return root, root / "out", summary, messages


def expected_clean():
    """The cleaned training corpus: titles and descriptions without tags, minus the bad and blank pairs."""
    title = [(HEADERS[3][0][7:-8], HEADERS[3][1][7:-8]), (HEADERS[4][0][13:-14], HEADERS[4][1][13:-14])]
    second = [(de.replace("Anna", "Berta"), en.replace("Anna", "Berta")) for de, en in title]
    rows = title + TALK1 + second + TALK2
    return [list(zip(*rows))[side] for side in (0, 1)]


def test_layout_and_summary(prepared):
    _, out, summary, messages = prepared
    assert set(os.listdir(out)) == OUTPUTS  # no temp files left
    assert summary["train"] == 60 and summary["valid"] == 2 and summary["test"] == 8
    assert summary["pair"] == "de-en" and summary["out_dir"] == str(out)
    for split in ("train", "valid", "test"):
        assert len(read(out, f"{split}.de")) == len(read(out, f"{split}.en")) == summary[split]
    assert read(out, "code")[0] == "#version: 0.2" and len(read(out, "code")) == summary["bpe_merges"] + 1
    # the tiny corpus runs out of pairs seen twice long before 10000 merges; subword-nmt says so, no crash
    assert 0 < summary["bpe_merges"] < 10000
    assert any("no pair has frequency" in m for m in messages)


def test_train_and_valid_are_cleaned_tokenized_lowercased_and_split_every_23rd(prepared):
    _, out, _, _ = prepared
    for side, lang in enumerate(LANGS):
        clean = oracle(expected_clean()[side], lang)
        assert unbpe(out, f"valid.{lang}") == clean[22::23]
        assert unbpe(out, f"train.{lang}") == [line for i, line in enumerate(clean, 1) if i % 23]
    assert unbpe(out, "valid.en") == ["and this here is a squid .", "why is the sea salty ?"]
    train_de, train_en = unbpe(out, "train.de"), unbpe(out, "train.en")
    assert train_de[:2] == ["anna beispiel : über das meer",
                            "ted talk untertitel : anna beispiel spricht über das meer ."]
    assert train_de[2] == "hallo , welt !" and train_en[2] == "hello , world !"
    assert 'he said : &quot; that &apos;s good . &quot;' in train_en  # perl's default escaping
    assert "es geht um neugier &amp; mut ." in train_de
    assert "danke ." in train_de  # ratio 1.5 is kept
    everything = train_de + train_en + unbpe(out, "valid.de") + unbpe(out, "valid.en")
    for gone in ("url", "talkid", "keywords", "&lt;", "&gt;", "ja .", "yes , of course"):
        assert not any(gone in line for line in everything), gone
    assert max(len(line.split()) for line in everything) <= 175 and "" not in everything


def test_test_split_is_the_five_sets_in_order(prepared):
    _, out, _, _ = prepared
    for side, lang in enumerate(LANGS):
        segs = [pair[side].strip().replace("’", "'") for name in TEST_SETS for pair in TEST_SEGS[name]]
        assert unbpe(out, f"test.{lang}") == oracle(segs, lang)
    assert unbpe(out, "test.en")[:3] == ["good morning .", "how &apos;s it going ?", "this is a test ."]
    assert unbpe(out, "test.de")[-1] == "bis morgen ."


def test_bpe_is_joint_and_reversible(prepared, tmp_path):
    root, out, _, _ = prepared
    assert any("@@ " in line for line in read(out, "train.de")) and any("@@ " in line for line in read(out, "train.en"))
    assert not any(line.endswith("@@") for name in OUTPUTS - {"code"} for line in read(out, name))
    small = iwslt14.prepare_iwslt14(root / "de-en.tgz", tmp_path / "five", bpe_merges=5, log=lambda m: None)
    assert small["bpe_merges"] == 5 and len(read(tmp_path / "five", "code")) == 6
    none = iwslt14.prepare_iwslt14(root / "de-en.tgz", tmp_path / "none", bpe_merges=0, log=lambda m: None)
    assert none["bpe_merges"] == 0 and not any("@@" in line for line in read(tmp_path / "none", "train.en"))
    assert read(tmp_path / "none", "train.en") == unbpe(out, "train.en")


def test_deterministic_and_same_files_for_both_directions(prepared, tmp_path):
    root, out, _, _ = prepared
    reverse = iwslt14.prepare_iwslt14(root / "de-en.tgz", tmp_path / "again", src="en", tgt="de", log=lambda m: None)
    assert reverse["src"] == "en" and reverse["train"] == 60
    for name in OUTPUTS:
        assert (tmp_path / "again" / name).read_bytes() == (out / name).read_bytes(), name


def test_members_are_read_not_extracted(tmp_path):
    (tmp_path / "a").mkdir()
    evil = {"../evil.txt": b"x\n", str(tmp_path / "absolute.txt"): b"x\n", "./de-en/extra.txt": b"x\n"}
    archive = make_archive(tmp_path / "a" / "de-en.tgz", {**release_members(), **evil})
    iwslt14.prepare_iwslt14(archive, tmp_path / "a" / "out", bpe_merges=5, log=lambda m: None)
    assert sorted(os.listdir(tmp_path)) == ["a"] and sorted(os.listdir(tmp_path / "a")) == ["de-en.tgz", "out"]


def test_dot_slash_member_names_are_accepted(tmp_path):
    members = {f"./{name}": data for name, data in release_members().items()}
    summary = iwslt14.prepare_iwslt14(make_archive(tmp_path / "x.tgz", members), tmp_path / "out", bpe_merges=5,
                                      log=lambda m: None)
    assert summary["train"] == 60


def bad_utf8():
    data = release_members()["de-en/train.tags.de-en.en"].split(b"\n")
    data[6] = b"caf\xe9 au lait"
    return b"\n".join(data)


def misaligned():
    return release_members()["de-en/train.tags.de-en.de"] + "Noch ein Satz.\n".encode()


def headers_only():
    return "\n".join(h[0] for h in HEADERS[:3]).encode() + b"\n"


def write(path, data):
    path.write_bytes(data)
    return path


RAW_LINES = len(train_rows()) - 6  # train.tags lines per language after grep -v drops two talks' 3 headers
ARCHIVES = {  # name: (make it in tmp_path, words the message must contain)
    "missing": (lambda p: p / "nowhere.tgz", ["not found", "de-en.tgz"]),
    "directory": (lambda p: p, ["not a file"]),
    "not gzip": (lambda p: write(p / "x.tgz", b"hello, not an archive\n"), ["gzip", "download"]),
    "plain tar": (lambda p: write(p / "x.tar", tar_bytes("w")), ["gzip"]),
    "truncated": (lambda p: write(p / "x.tgz", tar_bytes("w:gz")[:400]), ["truncated"]),
    "member missing": (lambda p: make_archive(p / "x.tgz", **{"de-en/IWSLT14.TED.tst2011.de-en.en.xml": None}),
                       ["de-en/IWSLT14.TED.tst2011.de-en.en.xml", "missing", "train.tags"]),
    "no train": (lambda p: make_archive(p / "x.tgz", **{"de-en/train.tags.de-en.de": None}),
                 ["de-en/train.tags.de-en.de", "missing"]),
    "non-utf8": (lambda p: make_archive(p / "x.tgz", **{"de-en/train.tags.de-en.en": bad_utf8()}),
                 ["de-en/train.tags.de-en.en line 7", "UTF-8"]),
    "misaligned": (lambda p: make_archive(p / "x.tgz", **{"de-en/train.tags.de-en.de": misaligned()}),
                   ["aligned", f"{RAW_LINES + 1} lines", f"has {RAW_LINES}"]),
    "empty after cleaning": (lambda p: make_archive(p / "x.tgz", **{f"de-en/train.tags.de-en.{lang}": headers_only()
                                                                    for lang in LANGS}),
                             ["only 0 training pairs survive cleaning"]),
}


def tar_bytes(mode):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:
        for name, data in release_members().items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("case", sorted(ARCHIVES))
def test_bad_archive_raises_data_error_and_writes_nothing(tmp_path, case):
    make, words = ARCHIVES[case]
    (tmp_path / "in").mkdir()
    archive = make(tmp_path / "in")
    fresh, kept = tmp_path / "fresh", tmp_path / "kept"
    kept.mkdir()
    (kept / "train.de").write_text("old\n")
    for out in (fresh, kept):
        with pytest.raises(DataError) as error:
            iwslt14.prepare_iwslt14(archive, out, log=lambda m: None)
        for word in words:
            assert word in str(error.value), (word, str(error.value))
    assert not fresh.exists()
    assert os.listdir(kept) == ["train.de"] and (kept / "train.de").read_text() == "old\n"


def test_unwritable_output_raises_data_error(tmp_path):
    archive = make_archive(tmp_path / "de-en.tgz")
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):
        with pytest.raises(DataError, match="directory"):
            iwslt14.prepare_iwslt14(archive, out, log=lambda m: None)
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize("kwargs", [dict(src="de", tgt="de"), dict(src="../x"), dict(bpe_merges=-1)])
def test_bad_arguments_raise_data_error(tmp_path, kwargs):
    with pytest.raises(DataError):
        iwslt14.prepare_iwslt14(make_archive(tmp_path / "de-en.tgz"), tmp_path / "out", log=lambda m: None, **kwargs)
    assert not (tmp_path / "out").exists()
