"""The synthetic German-to-English task of `train_nmt.py --corpus synthetic` (specs.CORPORA).

    pairs = synthetic_pairs(22000, seed=0)
    # [("Morgen hat das Bild eine Blume gebraucht.", "Tomorrow the picture has needed a flower."), ...]

A small lexicon and grammar with German word order: verb second in main clauses, verb final in
subordinate clauses ("weil", "dass"), separable and modal verbs with the infinitive or participle at the
end, case and gender in articles and adjective endings. Not natural language: a task that a small model
learns in minutes, for fast tests.
"""

import random

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
