"""The README's Results table and the sweeps' detail tables, written from the result files in results/.

    python results/tables.py                  # rewrite the generated tables in README.md and results/*/README.md
    python results/tables.py --check          # exit 1 if a table differs from the files, or a row is stale
    python results/tables.py --check --allow-stale   # the same, but stale rows (marked so) pass
    python results/tables.py --publish fig2_rows      # re-read rows under their changed rule (results/rules.json)

Every number in those tables comes from a file here (results.json, results-*.csv, per-run metrics CSVs,
the analysis JSONs), and every verdict from a rule stated in the constants below (the analyses': those of
harness/grads_job.py), so a new measurement is one command away from the README and a changed number fails
the test suite (tests/test_results_tables.py). A generated table sits between the lines
`<!-- generated: NAME -->` and `<!-- end: NAME -->`.

The README's Results table has one row per claim (claim | paper | here | verdict): the paper's own number,
the numbers measured here (each row links its results page or folder for the rest), and the verdict with
its rule beside it. Above the table a line tallies the verdicts; below it a line gives the code
fingerprints and dates the rows were measured on. Verdicts: "yes" only where the row's rule holds, "in
direction" where only the effect's sign agrees, "NO" where not even that, and "not testable" where the
scale cannot show it; "passes" and "fails" are said only of a rule's checks. Each run records the
`code_version` it ran on (harness/rundir.py); a row any of whose runs ran on other code than today's
says "stale: would be VERDICT", and `--check` fails on it unless `--allow-stale` is given. Rows about final
quality must also pass the convergence premise (results/protocols.md, 2026-11-29): the training left could
not change the verdict. And results/rules.json holds, for each row function, a hash of its rule and of its
experiment's protocol as its verdicts were published (reproduce.py writes it): `--check` fails on a row
whose rule or protocol changed since, until `--publish` records it after the protocol that changes it.
"""

import argparse
import ast
import collections
import csv
import datetime
import hashlib
import json
import math
import os
import re
import sys

from harness import rundir  # no Keras
from reproduction.certificates import certified_as
# read as the runs were chosen, by the premises they were staged by:
from reproduction.experiments import (DEPTH_PREMISE, EXPERIMENTS, FIG2_RATES, FIG2_SGD_PREMISE, final_loss, loss_ratio,
                                      ends_at_the_cap, rate, sgd_trains, test_bleu)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The rules behind each "yes", fixed from the papers' own effect sizes before the runs they judge
# (stated beside each verdict of the README's table). BLEU is tokenized test BLEU (beam 5) unless a rule says otherwise;
# a run that diverged counts as 0 BLEU.
FIG2_POST_MIN = 20.0       # Fig 2: Post-LN with warmup reaches this (a baseline that trains) ...
FIG2_COLD_RATIO = 0.4      # ... and without warmup ends at most this fraction of it (paper: 8.45 / ~34 = 0.25)
FIG4_AS_WELL = 1.0         # Fig 4, "as well as": Pre-LN without warmup >= Post-LN with warmup - this
FIG4_FASTER = 0.7          # Fig 4, "and faster": Pre-LN reaches Post-LN's final validation BLEU within this
                           # fraction of Post-LN's updates (paper: about 0.6)
RADAM_POST_GAP = 2.0       # Fig 4, RAdam: Post-LN + RAdam without warmup >= Post-LN + Adam + warmup - this
RADAM_PRE_GAP = 2.0        # Fig 4, RAdam: Pre-LN + RAdam within this of Pre-LN + Adam
DEPTH_POST_DROP = 5.0      # DeepNet: Post-LN at the deepest setting diverges or ends this far below its shallowest
DEPTH_MIN_BLEU = DEPTH_PREMISE  # 15, DeepNet's premise: shallow Post-LN reaches it; and Pre-LN and DeepNorm
                                # reach it at every depth
DEPTH_DEEPNORM_SLACK = 0.5  # DeepNet: DeepNorm >= Pre-LN - this at every depth >= DEPTH_DEEP (mean over seeds)
DEPTH_DEEP, DEPTH_SEEDS = 12, 2
FIG5_SPEEDUP = 700 / 500   # Fig 5(a): Pre-LN reaches Post-LN's final loss at least 1.4x sooner (700k / 500k),
                           # at a target loss below the corpus's unigram entropy
# Fixed with the fair-test protocols (results/protocols.md), before their runs:
FIG2_SGD_MIN = FIG2_SGD_PREMISE  # 10, Fig 2(c, d)'s premise: SGD with warmup reaches it (for SGD, in place of
                                 # FIG2_POST_MIN)
SHORT_WARMUP_GAP = 1.0     # Fig 2's short warmup: "in direction" when it ends at least this far below the full one
# Fixed with the converged verdicts (results/protocols.md, 2026-11-29), before the rows were read again:
CONVERGENCE_R = 1 / (0.75 ** -0.5 - 1)  # 6.46: the loss still to come on L∞ + c·t^(-1/2) after it fell by Δ over
                                         # its last quarter; every final-quality verdict must survive it
SLOPE_MIN_BLEU = 5.0       # the runs that give an experiment's BLEU per nat: those that reached this test BLEU
FIG5_MARGIN = 1.0          # Fig 5(a): the target must lie this many nats below the unigram entropy to be testable
FIG5_LEVELS = (250, 500, 750)  # Fig 5(a): the speed-up at the losses Post-LN reaches at these updates


def _read_json(root, path):
    with open(os.path.join(root, "results", path), encoding="utf-8") as f:
        return json.load(f)


def _json_or(root, path, default):
    """results/PATH's JSON, or `default` where it is missing or unreadable."""
    try:
        return _read_json(root, path)
    except (OSError, ValueError):
        return default


def _read_csv(root, path):
    with open(os.path.join(root, "results", path), encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _by_run(rows):
    return {row["run"]: row for row in rows}


def _f(value, digits=2):
    return f"{float(value):.{digits}f}"


def _verdict(yes, direction):
    return "yes" if yes else "in direction" if direction else "NO"


def first_reaching(curve, target):
    """The first update at which a metrics CSV's validation BLEU is at least `target`, or None."""
    return next((int(r["updates"]) for r in curve if float(r["valid_bleu"]) >= target), None)


# --- which code measured each row -------------------------------------------------------------------

TODAY = rundir.fingerprint()  # the code in this repository now (results/tables.py judges its own checkout)


def versions(root, *names):
    """{fingerprint or None: {measured date or None}} of the runs behind a row: each name is a results/ JSON
    (with a "code_version" dict), or "CSV:RUN" (a row of a results CSV with code_version and measured)."""
    found = {}
    for name in names:
        if ":" in name:
            path, run = name.split(":")
            row = _by_run(_read_csv(root, path)).get(run, {})
            found.setdefault(row.get("code_version") or None, set()).add(row.get("measured") or None)
        else:
            data = _read_json(root, name)
            for item in data if isinstance(data, list) else [data]:
                version = item.get("code_version") or {}
                if isinstance(version, str):
                    found.setdefault(version, set()).add(item.get("measured"))
                else:
                    found.setdefault(version.get("fingerprint"), set()).add(version.get("measured"))
    return found


def date_span(dates):
    """The first and last of some measured dates: "2026-11-27 to 2026-11-29", one date alone, or "?"."""
    known = sorted(date for date in dates if date)
    return "?" if not known else known[0] if known[0] == known[-1] else f"{known[0]} to {known[-1]}"


def measured_cell(found):
    """The dates and code fingerprints of a row's runs, in one line (what `--check` prints for a stale row)."""
    parts = sorted(f"{date_span(dates)}, code {fp}" if fp else "before code versions were recorded"
                   for fp, dates in found.items())
    return "; ".join(dict.fromkeys(parts))


def is_stale(found, job):
    """Whether a row of `job` (reproduction/certify.py's JOBS) ran on other code than today's: code neither today's
    nor certified to give its numbers for that job (`python reproduce.py --certify`, results/certify/)."""
    return any(not same_code(fp, job) for fp in found)


def same_code(fp, job):
    """Whether code `fp` gives today's numbers for the rows of `job`: it is today's, or certificates make them
    equivalent."""
    return fp == TODAY or certified_as(fp, ROOT, job) == certified_as(TODAY, ROOT, job)


# A row of the Results table. `claim` is "LABEL: the claim" (what reproduce.py prints), `verdict` the whole
# verdict in plain text ("yes — rule: ...", or "stale: would be yes — rule: ..." for a row measured on other
# code than today's); `word` is the verdict alone (yes, in direction, NO, not testable), `detail` the rule
# after it. reproduce.py reads row[0] and row[2].
Row = collections.namedtuple("Row", "claim here verdict measured_on label link paper word detail stale found job brief")


def rule(*checks):
    """The rule beside a verdict: " — rule: CHECK; CHECK", each check with "(passes)" or "(fails)" when the
    rule has more than one (a lone check passes exactly when the verdict is yes)."""
    several = len(checks) > 1
    return " — rule: " + "; ".join(text + ("" if not several or ok is None else " (passes)" if ok else " (fails)")
                                   for text, ok in checks)


BRIEF_WORDS = 14  # a verdict's reason in the README's table; a longer rule is read on the row's page


def judged(label, claim, link, paper, here, word, detail, found, job="translation", brief=None):
    """A row of the table, its verdict marked stale when any of its runs ran on other code than today's (for
    its `job`: the group of rows a certificate covers). `detail`: the rule and its checks, or the premise that
    failed, in full (the row's page); `brief`: the reason the README's table gives, by default `detail`
    where it has at most BRIEF_WORDS words."""
    stale = is_stale(found, job)
    verdict = ("stale: would be " if stale else "") + word + detail
    if brief is None:
        brief = detail if len(detail.split()) <= BRIEF_WORDS + 2 else " — its rule and checks on its page"
    return Row(f"{label}: {claim}", here, verdict, measured_cell(found), label, link, paper, word, detail, stale,
               found, job, brief)


# --- the protocols' runs (results/protocols.md) ----------------------------------------------------

def has_protocol(root, name):
    """Whether results/NAME holds the runs of its fair-test protocol (runs-NAME.csv, written with them)."""
    return os.path.exists(os.path.join(root, "results", name, f"runs-{name}.csv"))


Arm = collections.namedtuple("Arm", "name grid rate seeds")  # grid {lr: row of seed 1}; seeds: rows at `rate`


def protocol_rows(root, name, table=None):
    """The rows of results/NAME's results table, each with its run's arm, lr and seed (runs-NAME.csv)."""
    results = _by_run(_read_csv(root, table or f"{name}/results-{name}.csv"))
    return [dict(results[r["run"]], arm=r["arm"], lr=float(r["lr"]), seed=int(r["seed"]))
            for r in _read_csv(root, f"{name}/runs-{name}.csv") if r["run"] in results]


# An arm whose rate is chosen only among the rates that pass its premise (results/protocols.md): Figure 2's
# SGD with warmup, among those that reach FIG2_SGD_MIN. Without one, the arm has no chosen rate.
PREMISES = {"post-sgd-warmup": sgd_trains}
# An arm run at another arm's chosen rate (and beside it, reported only): SGD without warmup at r* and 2 r*.
FOLLOWS = {"post-sgd-nowarmup": "post-sgd-warmup"}


def protocol_arms(root, name, table=None):
    """{arm: Arm} of results/NAME: each arm's grid (seed 1 at every rate), the rate chosen from it by the
    final validation loss (ties: the smaller rate) among those that pass the arm's premise (`PREMISES`; None
    if none does; an arm of `FOLLOWS`: its leader's rate), and its rows at that rate, one per seed."""
    arms = {}
    for row in protocol_rows(root, name, table):
        arm = arms.setdefault(row["arm"], {"grid": {}, "rows": []})
        arm["rows"].append(row)
        if row["seed"] == 1:
            arm["grid"][row["lr"]] = row
    made = {}
    for arm_name, arm in sorted(arms.items(), key=lambda item: item[0] in FOLLOWS):  # leaders first
        if arm_name in FOLLOWS:
            lr = made[FOLLOWS[arm_name]].rate if FOLLOWS[arm_name] in made else None
        else:
            passes = [lr for lr, row in arm["grid"].items() if PREMISES.get(arm_name, lambda row: True)(row)]
            lr = min(passes, key=lambda lr: (final_loss(arm["grid"][lr]), lr)) if passes else None
        made[arm_name] = Arm(arm_name, dict(sorted(arm["grid"].items())), lr,
                             sorted((r for r in arm["rows"] if r["lr"] == lr), key=lambda r: r["seed"]))
    return made


def _mean(values):
    values = list(values)
    return sum(values) / len(values)


def seed_bleu(arm):
    """(mean test BLEU over the seeds at the chosen rate, its text with the range: "27.45 (26.90-27.80)")."""
    scores = [test_bleu(r) for r in arm.seeds]
    return _mean(scores), f"{_mean(scores):.2f}" + (f" ({min(scores):.2f}-{max(scores):.2f})" if len(scores) > 1 else "")


def arm_versions(root, name, *arms):
    return versions(root, *(f"{name}/results-{name}.csv:{r['run']}" for arm in arms
                            for r in [*arm.grid.values(), *arm.seeds]))


# Arms run at fixed rates, each read on its own (Figure 2's Adam runs at the paper's two rates): no rate is
# chosen among them, so the grid shows every seed's mean at each rate.
EACH_RATE = {("fig2", arm) for arm in ("post-warmup", "post-warmup38", "post-nowarmup", "pre-nowarmup")}


def grid_table(root, name, labels=None, table=None):
    """Every arm's rate grid, seed 1 at each rate (final validation loss and test BLEU, or for BERT the
    final masked-LM accuracy; the chosen rate in bold), and each seed at the chosen rate with the mean; an
    arm of EACH_RATE, the mean of its seeds at each rate instead."""
    arms = protocol_arms(root, name, table)
    bert = table is not None
    every = protocol_rows(root, name, table)

    def score(row):
        return f"{100 * float(row['final_valid_accuracy']):.1f} %" if bert else _f(test_bleu(row))

    rates = sorted({lr for arm in arms.values() for lr in arm.grid})
    what = "accuracy" if bert else "test BLEU"
    lines = ["| arm | " + " | ".join(f"lr {rate(lr)}: valid loss / {what}" for lr in rates)
             + f" | at the chosen rate, each seed: valid loss / {what} |", "| --- |" + " --- |" * (len(rates) + 1)]
    for arm in arms.values():
        if (name, arm.name) in EACH_RATE:
            at = {lr: [r for r in every if r["arm"] == arm.name and r["lr"] == lr] for lr in rates}
            cells = [f"{_mean(final_loss(r) for r in at[lr]):.3f} / {_f(_mean(test_bleu(r) for r in at[lr]))}"
                     + (f" ({len(at[lr])} seeds)" if len(at[lr]) > 1 else "") if at[lr] else "-" for lr in rates]
            lines.append(f"| {(labels or {}).get(arm.name, arm.name)} | {' | '.join(cells)} | each rate read on its own "
                         "(the mean of its seeds) |")
            continue
        cells = []
        for lr in rates:
            row = arm.grid.get(lr)
            if row is None:
                cell = "-"
            else:
                cell = (f"{final_loss(row):.3f}" if final_loss(row) < float("inf") else "diverged") + f" / {score(row)}"
            cells.append(f"**{cell}**" if lr == arm.rate else cell)
        seeds = "; ".join(f"{final_loss(r):.3f} / {score(r)}" for r in arm.seeds) or "none: no rate passes its premise"
        mean = "" if bert or len(arm.seeds) < 2 else f" (mean BLEU {_f(seed_bleu(arm)[0])})"
        lines.append(f"| {(labels or {}).get(arm.name, arm.name)} | {' | '.join(cells)} | {seeds}{mean} |")
    return "\n".join(lines)


def depth_matched(root):
    """DeepNet's matched-rate reading (results/protocols.md, 2026-11-29, 3; reported, judging nothing): seed 1 of
    every placement at each rate that all three ran at one depth, test BLEU and final validation loss."""
    if not has_protocol(root, "depth"):
        return NOT_YET.format(name="depth")
    arms = protocol_arms(root, "depth")
    names = {"post": "Post-LN", "pre": "Pre-LN", "deepnorm": "DeepNorm"}
    depths = sorted({int(name.rsplit("-", 1)[1][:-1]) for name in arms})
    lines = ["| layers | lr | " + " | ".join(f"{name}: test BLEU / valid loss" for name in names.values()) + " |",
             "| --- | --- |" + " --- |" * len(names)]
    for depth in depths:
        if any(f"{norm}-{depth}L" not in arms for norm in names):
            continue  # a failed premise: the other placements did not run
        grids = [arms[f"{norm}-{depth}L"].grid for norm in names]
        for lr in sorted(set.intersection(*(set(grid) for grid in grids))):
            cells = [f"{_f(test_bleu(grid[lr]))} / " + (f"{final_loss(grid[lr]):.3f}" if final_loss(grid[lr]) <
                                                         float("inf") else "diverged") for grid in grids]
            lines.append(f"| {depth} | {rate(lr)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


NOT_YET = ("Not yet measured under its protocol (results/protocols.md): `python reproduce.py --only {name}` "
           "measures it and writes this table.")


def protocol_page(name, table=None):
    """A results page's table: the protocol's grid once its runs are in results/, else a line saying how to
    measure it."""
    def make(root):
        if has_protocol(root, name):
            return grid_table(root, name, table=table)
        return NOT_YET.format(name=name)
    return make


# --- the convergence premise (results/protocols.md, 2026-11-29, 1) ----------------------------------

def valid_losses(curve):
    """[(update, validation loss)] of a run's metrics rows that have one."""
    return [(int(r["updates"]), float(r["valid_loss"])) for r in curve if r.get("valid_loss") not in (None, "")]


def loss_at(points, update):
    """The validation loss at `update`, interpolated between the validation points [(update, loss)]."""
    before = max((p for p in points if p[0] <= update), default=points[0])
    after = min((p for p in points if p[0] >= update), default=points[-1])
    share = 0.0 if after[0] == before[0] else (update - before[0]) / (after[0] - before[0])
    return before[1] + share * (after[1] - before[1])


def last_quarter_fall(curve):
    """Δ of a run's metrics (rows with updates and valid_loss): its validation loss at three quarters of its
    last update, interpolated between validation points, minus its final one."""
    points = valid_losses(curve)
    return loss_at(points, 0.75 * points[-1][0]) - points[-1][1]


def bleu_per_nat(root, folder):
    """s, an experiment's test BLEU per nat of final validation loss: the least-squares slope over the runs of
    results/FOLDER that reached SLOPE_MIN_BLEU (negative: a lower loss, a higher BLEU); None with fewer than two."""
    runs = [r for r in _read_csv(root, f"{folder}/results-{folder}.csv")
            if test_bleu(r) >= SLOPE_MIN_BLEU and final_loss(r) < float("inf")]
    x, y = [final_loss(r) for r in runs], [test_bleu(r) for r in runs]
    if len(set(x)) < 2:
        return None  # too few runs trained to tell
    mx, my = _mean(x), _mean(y)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sum((a - mx) ** 2 for a in x)


def converged(root, folder, arms, judge, names=None):
    """The convergence premise of a rule about final quality. `arms`: {arm: its runs at the chosen rate, one a
    seed}; `judge(means)`: the rule's word for {arm: mean test BLEU}. Each arm's BLEU is projected to what the
    training left would give, its mean - s·R·Δ (`bleu_per_nat`, `CONVERGENCE_R`, `last_quarter_fall`). Returns
    (word, premise text): the rule's word on the measured means where the projected means give it too, else
    "not testable" with each arm's Δ, the word the projection reads and the budget from which the same curves
    give it."""
    slope = bleu_per_nat(root, folder)
    if slope is None:
        return "not testable", f"{CONVERGED} (fails): fewer than two runs reached {SLOPE_MIN_BLEU:g} BLEU to tell BLEU per nat"
    fall = {arm: _mean(last_quarter_fall(_read_csv(root, f"{folder}/{r['run']}.csv")) for r in runs)
            for arm, runs in arms.items()}
    means = {arm: _mean(test_bleu(r) for r in runs) for arm, runs in arms.items()}

    def at(times):  # the means at `times` the updates (None: once the loss has stopped falling)
        left = 1.0 if times is None else 1 - times ** -0.5
        return {arm: means[arm] - slope * CONVERGENCE_R * fall[arm] * left for arm in means}

    now, end = judge(means), judge(at(None))
    if now == end:
        return now, CONVERGED
    times = next((t for t in (2, 4, 8, 16, 32, 64) if judge(at(t)) == end), None)
    projected = at(None)
    falls = ", ".join(f"{(names or {}).get(arm, arm)} {fall[arm]:.3f} ({projected[arm]:.1f})" for arm in arms)
    losses = {arm: _mean(final_loss(r) for r in runs) - CONVERGENCE_R * fall[arm] for arm, runs in arms.items()}
    under = [f"{(names or {}).get(arm, arm)} {loss:.3f}" for arm, loss in losses.items() if loss < SMOOTHING_FLOOR]
    return "not testable", (f"{CONVERGED} (fails): over the last quarter the loss still fell by {falls} nats "
                            f"(projected BLEU, at {slope:.1f} BLEU a nat); projected, the rule reads {end}"
                            + (f" from about {times}x the updates" if times else "")
                            + f"; the projection has no ceiling on BLEU and no floor on the loss"
                            + (f" (projected losses under the {SMOOTHING_FLOOR:.3f}-nat floor of label smoothing: "
                               + ", ".join(under) + ")" if under else "")
                            + ", so it judges nothing (results/protocols.md, 2026-12-02)")


def still_falling(premise):
    """The README's reason for a verdict the convergence premise made "not testable" (`converged`'s text)."""
    reads = re.search(r"still fell .* the rule reads (.+?)(?: from about (\d+)x the updates)?; the projection", premise)
    if not reads:  # another reason: too few runs trained to tell BLEU per nat
        return " — premise: " + premise.split("(fails): ")[-1]
    return " — curves still falling; an unbounded projection, not a verdict, reads " + reads.group(1) \
        + (f" from {reads.group(2)}x the updates" if reads.group(2) else "")


CONVERGED = "the training left cannot change it"


def smoothing_floor(epsilon, vocabulary):
    """The lowest cross entropy any model can reach against targets smoothed by `epsilon` over `vocabulary`
    tokens: the entropy of the smoothed target, -(1 - ε + ε/V) ln(1 - ε + ε/V) - (V - 1)(ε/V) ln(ε/V)."""
    top, rest = 1 - epsilon + epsilon / vocabulary, epsilon / vocabulary
    return -top * math.log(top) - (vocabulary - 1) * rest * math.log(rest)


SMOOTHING_FLOOR = smoothing_floor(0.1, 4000)  # 1.154 nats: label smoothing 0.1 over the cpu preset's 4,000 tokens


def judged_rule(word, premise, *checks):
    """The text beside a final-quality verdict: its rule with the convergence premise as one more check, or, for
    "not testable", the premise that failed."""
    return f" — premise: {premise}" if word == "not testable" else rule(*checks, (premise, True))


# --- the rows of the README's Results table ---------------------------------------------------------
# Each row: the claim, the paper's own number or effect, the numbers measured here (the rest of each run is
# on the row's results page), and the verdict with its rule.

AS_WELL_PAPER = "comparable BLEU without warmup (Fig 4: IWSLT14, WMT14)"


def analysis_rows(root):
    """The analyses' rows; their verdicts are the ones analyze_grads.py wrote (its rules: harness/grads_job.py)."""
    summary = {row["claim"]: row for row in _read_json(root, "analysis/summary.json")}

    def pick(prefix):
        return next(row for claim, row in summary.items() if claim.startswith(prefix))

    layers = pick("Fig 3(a,b)")
    ratios = re.findall(r"(post|pre) ([\d.]+)", layers["measured"])
    post_slope, pre_slope = pick("Fig 3(c,d)/Thm 1: Post-LN"), pick("Fig 3(c,d)/Thm 1: Pre-LN")
    lemma, lemma_pre = pick("Lemma 2: Post-LN"), pick("Lemma 2: Pre-LN")
    simple, simple_pre = pick("Lemma 2 (simplified): Post-LN"), pick("Lemma 2 (simplified): Pre-LN")
    warm, update = pick("After"), pick("DeepNet")
    slope_verdicts = {post_slope["agrees"], pre_slope["agrees"]}
    lemma_verdicts = {lemma["agrees"], lemma_pre["agrees"], simple["agrees"], simple_pre["agrees"]}
    growth = dict(re.findall(r"(post|deepnorm) ([\d.]+)", update["measured"]))
    found = versions(root, "analysis/summary.json")
    rows = [
        ("Fig 3(a, b)", "FFN gradients at init grow with the layer index for Post-LN, flat for Pre-LN",
         "results/analysis/fig3-layers.png", "Post-LN's grow with the layer index, Pre-LN's stay flat (curves)",
         "decoder W2, last / first layer: " + ", ".join(f"{'Post' if n == 'post' else 'Pre'}-LN {v}" for n, v in ratios),
         layers["agrees"], rule(("Post-LN over 1.2, Pre-LN between 0.5 and 2", None))),
        ("Fig 3(c, d), Theorem 1", "the last layer's gradient against depth L",
         "results/analysis/fig3-depth.png", "Post-LN's independent of L, Pre-LN's falling as L^-1/2",
         f"log-log slope over depths 2-8: Post-LN {post_slope['measured']}, Pre-LN {pre_slope['measured']} "
         f"(theory at these depths {post_slope['theory']}, {pre_slope['theory']}; -0.5 as L grows)",
         "yes" if slope_verdicts == {"yes"} else "NO" if "NO" in slope_verdicts else "in direction",
         rule(("slopes within 0.1 of the theory's range at these depths", None))),
        ("Lemma 2", "hidden-state norms at init", "results/analysis/lemma2.png",
         "Post-LN E\\|\\|x^{post,5}\\|\\|^2 = 3d/2; Pre-LN between (1 + l/2) d and (1 + 3l/2) d",
         f"real encoder: Post-LN {lemma['measured']} d (theory with FFN 2d: {lemma['theory']} d), Pre-LN "
         f"{lemma_pre['measured']} its bounds; simplified setting: {simple['measured']} d (theory {simple['theory']} d), "
         f"Pre-LN {simple_pre['measured']}",
         "yes" if lemma_verdicts == {"yes"} else "NO" if "NO" in lemma_verdicts else "in direction",
         rule(("within 5 % of the theory, Pre-LN inside its bounds", None))),
        ("Sec 3.4", "after the warmup stage Post-LN's gradients are small", "results/analysis/after-warmup.png",
         "small once warmup ends (no number)",
         re.sub(r"^mean grad norm x([\d.]+) of init$", r"mean FFN gradient norm \1x its value at init",
                warm["measured"]) + f", after {warm['claim'].split()[1]} warmup updates",
         warm["agrees"], rule(("below 1x its value at init", None))),
        ("DeepNet", "the model update \\|\\|ΔF\\|\\| grows with depth for Post-LN, stays bounded with DeepNorm",
         "results/analysis/deepnet-update.png", "Post-LN's grows with depth, DeepNorm's bounded (theory)",
         f"one Adam step, \\|\\|ΔF\\|\\| / \\|\\|F\\|\\| from 2 to 16 layers: grows {growth['post']}x for Post-LN, "
         f"{growth['deepnorm']}x for DeepNorm",
         update["agrees"], rule(("Post-LN grows over 1.05x, DeepNorm at most 1.05x", None))),
    ]
    return [judged(label, claim, link, paper, here, word, detail, found, "analysis")
            for label, claim, link, paper, here, word, detail in rows]


def fig5_rows(root):
    """Figure 5(a)'s row, and 5(b, c)'s where MRPC was fine-tuned (a reproduction without GLUE MRPC has none)."""
    rows = [fig5_row(root)]
    mrpc = os.path.join(root, "results", "fig5", "finetune-mrpc.csv")
    tuned = _read_csv(root, "fig5/finetune-mrpc.csv") if os.path.exists(mrpc) else []
    means = {r["run"]: float(r["dev_accuracy_mean"]) for r in tuned}
    if means:
        same = len({round(m, 4) for m in means.values()}) == 1
        rows.append(judged("Fig 5(b, c)", "Pre-LN checkpoints fine-tune faster on MRPC and RTE",
                           "results/fig5/README.md", "curves only",
                           "MRPC dev accuracy of the final checkpoints: "
                           + ", ".join(f"{run} {100 * m:.1f} %" for run, m in means.items()),
                           "not testable" if same
                           else _verdict(False, _recipe(means, "pre-no-warmup") > _recipe(means, "post-warmup")),
                           " — both checkpoints give the same accuracy at this scale" if same else "",
                           versions(root, *(f"fig5/finetune-mrpc.csv:{run}" for run in means)), "bert"))
    return rows


def _recipe(means, recipe):
    """The MRPC accuracy of the checkpoint of a BERT recipe (its runs are named RECIPE or RECIPE-lrRATE)."""
    return next((m for run, m in means.items() if run == recipe or run.startswith(recipe + "-lr")), 0)


# The rows judged under the fair-test protocols (results/protocols.md), once their runs are in results/.

def _reach(ratios, share):
    """How soon Pre-LN reaches a level of Post-LN's: "in 0.74x its updates" (the mean over the seeds), or, where
    some seed never does, in how many it does ("in none of 3 seeds", "in only 1 of 3 seeds")."""
    reached = sum(ratio is not None for ratio in ratios)
    if share is not None:
        return f"in {share:.2f}x its updates"
    return f"in none of {len(ratios)} seeds" if not reached else f"in only {reached} of {len(ratios)} seeds"


def fig4_read(root):
    """(folder, arms, versions of the runs): Figure 4's arms as its rows read them. Once `fig4-long` has
    published (results/protocols.md, 2026-11-29, 2), each arm's seeds are its runs there, at the rate Figure
    4 chose, twice the updates (the grids stay Figure 4's); before (or while it lacks some), Figure 4's own."""
    arms = protocol_arms(root, "fig4")
    if not os.path.exists(os.path.join(root, "results", "fig4-long", "results-fig4-long.csv")):
        return "fig4", arms, lambda *chosen: arm_versions(root, "fig4", *chosen)
    longer = _by_run(_read_csv(root, "fig4-long/results-fig4-long.csv"))
    if not all(r["run"] in longer for arm in arms.values() for r in arm.seeds):  # not every arm's runs: not read
        return "fig4", arms, lambda *chosen: arm_versions(root, "fig4", *chosen)
    arms = {name: arm._replace(seeds=[dict(longer[r["run"]], arm=name, lr=r["lr"], seed=r["seed"])
                                      for r in arm.seeds]) for name, arm in arms.items()}
    return "fig4-long", arms, lambda *chosen: versions(root, *(f"fig4-long/results-fig4-long.csv:{r['run']}"
                                                              for arm in chosen for r in arm.seeds))


def as_well_earlier(root):
    """Sec 4 and Fig 4's "as well as", one claim and one number: Pre-LN without warmup against Post-LN with
    warmup, each at its chosen rate, means over 3 seeds (at twice the updates once fig4-long has run:
    `fig4_read`); the main command's result beside it."""
    folder, arms, found = fig4_read(root)
    pre, post = arms["pre-adam-nowarmup"], arms["post-adam-warmup"]
    (pre_mean, pre_text), (post_mean, post_text) = seed_bleu(pre), seed_bleu(post)
    gap = pre_mean - post_mean
    main = _read_json(root, "main/results.json")
    here = (f"mean of {len(pre.seeds)} seed{'s' if len(pre.seeds) > 1 else ''}, each at its best rate: Pre-LN without warmup {pre_text}, Post-LN with "
            f"warmup {post_text}: {gap:+.2f}; the main command {_f(main['test_tokenized_bleu'])} in "
            f"{main['train_minutes']:.1f} min")
    word, premise = converged(root, folder, {"pre": pre.seeds, "post": post.seeds},
                              lambda m: _verdict(m["pre"] - m["post"] >= -FIG4_AS_WELL, False),
                              {"pre": "Pre-LN", "post": "Post-LN"})
    return judged("Sec 4, Fig 4", "Pre-LN trains without warmup as well as Post-LN with it", "results/fig4/README.md",
                  AS_WELL_PAPER, here, word,
                  judged_rule(word, premise, (f"mean ≥ Post-LN with warmup's − {FIG4_AS_WELL:g}", gap >= -FIG4_AS_WELL)),
                  {**found(pre, post), **versions(root, "main/results.json")},
                  brief=still_falling(premise) if word == "not testable" else None)


FIG4_NAMES = {"post-adam-warmup": "Post-LN Adam warmup", "post-adam-nowarmup": "Post-LN Adam", "post-radam": "Post-LN RAdam",
              "pre-adam-nowarmup": "Pre-LN Adam", "pre-radam": "Pre-LN RAdam"}


def radam_verdict(post_gap, pre_gap, fixed):
    """Figure 4's RAdam rule (results/protocols.md, 2026-11-29, 8), from the BLEU gaps of the means: Post-LN +
    RAdam against Post-LN + Adam with warmup (`post_gap`) and against Adam without warmup on RAdam's own
    schedule (`fixed`), Pre-LN + RAdam against Pre-LN + Adam (`pre_gap`). yes when both checks pass; in
    direction when one fails but RAdam lifts Post-LN above Adam without warmup (the sign of "fixes"); NO
    otherwise."""
    if post_gap >= -RADAM_POST_GAP and abs(pre_gap) <= RADAM_PRE_GAP:
        return "yes"
    return "in direction" if fixed > 0 else "NO"


def fig4_earlier(root):
    folder, arms, found = fig4_read(root)
    pre, post = arms["pre-adam-nowarmup"], arms["post-adam-warmup"]
    ratios, by_loss = [], []  # per seed: by greedy validation BLEU, and by validation loss (2026-11-29, 6)
    for pre_run in pre.seeds:
        post_run = next((r for r in post.seeds if r["seed"] == pre_run["seed"]), None)
        if post_run:
            pre_curve, post_curve = (_read_csv(root, f"{folder}/{r['run']}.csv") for r in (pre_run, post_run))
            target, end = float(post_curve[-1]["valid_bleu"]), int(post_curve[-1]["updates"])
            reached = first_reaching(pre_curve, target)
            ratios.append(reached / end if reached else None)
            loss = float(post_curve[-1]["valid_loss"])
            reached = next((int(r["updates"]) for r in pre_curve if float(r["valid_loss"]) <= loss), None)
            by_loss.append(reached / end if reached else None)
    share = _mean(ratios) if ratios and None not in ratios else None
    share_loss = _mean(by_loss) if by_loss and None not in by_loss else None
    both = (share, share_loss)
    every = min(int(b["updates"]) - int(a["updates"]) for a, b in zip(pre_curve, pre_curve[1:]))
    link = "results/fig4/README.md"
    means = {name: seed_bleu(arm) for name, arm in arms.items()}
    post_gap = means["post-radam"][0] - means["post-adam-warmup"][0]
    pre_gap = means["pre-radam"][0] - means["pre-adam-nowarmup"][0]
    fixed = means["post-radam"][0] - means["post-adam-nowarmup"][0]
    fixes, keeps = post_gap >= -RADAM_POST_GAP, abs(pre_gap) <= RADAM_PRE_GAP
    radam_word, radam_premise = converged(
        root, folder, {name: arm.seeds for name, arm in arms.items()},
        lambda m: radam_verdict(m["post-radam"] - m["post-adam-warmup"], m["pre-radam"] - m["pre-adam-nowarmup"],
                                m["post-radam"] - m["post-adam-nowarmup"]), FIG4_NAMES)
    return [
        judged("Fig 4 (Sec 4)", "... and faster", link, "Pre-LN there in about 0.6x Post-LN's updates",
               f"validation every {every} updates, {len(ratios)} seeds: Pre-LN reaches Post-LN's final greedy BLEU "
               f"{_reach(ratios, share)}, its final loss {_reach(by_loss, share_loss)}",
               _verdict(all(x is not None and x <= FIG4_FASTER for x in both), all(x is not None and x < 1 for x in both)),
               rule((f"by BLEU, mean within {FIG4_FASTER:g}x the updates", bool(share and share <= FIG4_FASTER)),
                    ("by loss, the same", bool(share_loss and share_loss <= FIG4_FASTER))),
               found(pre, post)),
        judged("Fig 4", "RAdam fixes Post-LN without warmup, and barely changes Pre-LN", link, "curves only",
               f"means at best rates: Post-LN + RAdam {_f(means['post-radam'][0])}, {post_gap:+.2f} against Adam with "
               f"warmup, {fixed:+.2f} against Adam without; Pre-LN + RAdam {_f(means['pre-radam'][0])}, "
               f"{pre_gap:+.2f} against Adam",
               radam_word,
               judged_rule(radam_word, radam_premise, (f"Post-LN ≥ Adam with warmup − {RADAM_POST_GAP:g}", fixes),
                           (f"Pre-LN within {RADAM_PRE_GAP:g} of Adam", keeps),
                           ("in direction if above Adam without warmup", None)),
               found(*arms.values()),
               brief=still_falling(radam_premise) if radam_word == "not testable" else
               f" — Post-LN + RAdam {fixed:+.2f} against Adam without warmup, {post_gap:+.2f} against Adam with it"),
    ]


def fig2_rows(root):
    """Figure 2's rows: Post-LN needs warmup and a short warmup is not enough (Adam, each read at the paper's
    two rates), and SGD needs warmup too (at the rate chosen for it)."""
    rows = protocol_rows(root, "fig2")
    link = "results/fig2/README.md"
    rates = [lr for lr in FIG2_RATES if fig2_runs(rows, "post-warmup", lr)]
    warmup, warmup38 = fig2_by_rate(root, rows, rates)
    missing = [rate(lr) for lr in FIG2_RATES if lr not in rates]
    later = f"; {', '.join(missing)} not run yet" if missing else ""
    counts = sorted({len(group) for r in warmup for group in r[4]}) or [0]
    seeds = f"{counts[0]}-{counts[-1]} seeds" if len(counts) > 1 else f"{counts[0]} seed{'s' if counts[0] != 1 else ''}"
    word, premise, brief = lower_of_rates(warmup)
    made = [fig2_warmup_row(root, judged("Fig 2 (Sec 3)", "Post-LN needs warmup", link,
                   "Post-LN without warmup 8.45 BLEU against about 34 with it (0.25x), at 5e-4 and 1e-3",
                   f"Adam, {seeds}, Post-LN with / without warmup: " + "; ".join(r[3] for r in warmup) + later,
                   word,
                   judged_rule(word, premise,
                               (f"at each rate: with warmup ≥ {FIG2_POST_MIN:g}", all(r[5] >= FIG2_POST_MIN for r in warmup)),
                               (f"without ≤ {FIG2_COLD_RATIO:g}x that; the lower word of the rates",
                                all(r[6] <= FIG2_COLD_RATIO for r in warmup))),
                   fig2_versions(root, *(group for r in warmup for group in r[4])), brief=brief))]
    word, premise, brief = lower_of_rates(warmup38)
    made.append(judged("Fig 2 (Sec 3)", "a short warmup (500 of 4,000 updates) is not enough for Post-LN", link,
                       "2.77 BLEU with warmup 500 against about 34 with 4,000",
                       f"Post-LN, warmup 38 / 300 (the paper's 1/8), {seeds}: " + "; ".join(r[3] for r in warmup38)
                       + later, word,
                       judged_rule(word, premise, (f"≤ {FIG2_COLD_RATIO:g}x the full warmup's; in direction if ≥ "
                                                   f"{SHORT_WARMUP_GAP:g} below it; the lower word of the rates", None)),
                       fig2_versions(root, *(group for r in warmup38 for group in r[4])), brief=brief))
    return made + [fig2_sgd_row(root, rows, link)]


def fig2_runs(rows, arm, lr=None):
    """The rows of Figure 2's `rows` of `arm` (at rate `lr`, if given)."""
    return [r for r in rows if r["arm"] == arm and (lr is None or r["lr"] == lr)]


def mean_bleu(found):
    """The mean test BLEU of the rows `found`."""
    return _mean(test_bleu(r) for r in found)


def fig2_versions(root, *groups):
    """`versions` of the runs of Figure 2's rows in `groups`."""
    return versions(root, *(f"fig2/results-fig2.csv:{r['run']}" for group in groups for r in group))


def fig2_needs_warmup(m):
    """Figure 2's rule on {arm: mean test BLEU}: Post-LN with warmup trains, and without it ends far below."""
    with_, without = m["post-warmup"], m["post-nowarmup"]
    ratio = without / with_ if with_ else 1.0
    return _verdict(with_ >= FIG2_POST_MIN and ratio <= FIG2_COLD_RATIO, ratio < 1)


def fig2_short_enough(m):
    """Figure 2's short warmup, the same way: warmup 38 ends far below the full warmup's 300."""
    full, short_ = m["post-warmup"], m["post-warmup38"]
    return ("yes" if (short_ / full if full else 1.0) <= FIG2_COLD_RATIO else
            "in direction" if short_ <= full - SHORT_WARMUP_GAP else "NO")


def fig2_by_rate(root, rows, rates):
    """([(lr, word, premise, text, (with, without, Pre-LN), mean with, ratio)], [(lr, word, premise, text,
    (warmup 38, warmup 300))]): Figure 2's two Adam rules read at each of `rates` on the means of its seeds."""
    labels = {"post-warmup": "with warmup", "post-nowarmup": "without", "post-warmup38": "warmup 38"}
    warmup, warmup38 = [], []
    for lr in rates:
        warm, cold, pre, short = (fig2_runs(rows, arm, lr) for arm in ("post-warmup", "post-nowarmup", "pre-nowarmup",
                                                                        "post-warmup38"))
        ratio = mean_bleu(cold) / mean_bleu(warm) if mean_bleu(warm) else 1.0
        word, premise = converged(root, "fig2", {"post-warmup": warm, "post-nowarmup": cold}, fig2_needs_warmup,
                                  labels)
        warmup.append((lr, word, premise, f"{rate(lr)}: {mean_bleu(warm):.2f} / {mean_bleu(cold):.2f} ({ratio:.2f}x), "
                       f"Pre-LN {mean_bleu(pre):.2f}", (warm, cold, pre), mean_bleu(warm), ratio))
        word, premise = converged(root, "fig2", {"post-warmup38": short, "post-warmup": warm}, fig2_short_enough,
                                  labels)
        fraction = mean_bleu(short) / mean_bleu(warm) if mean_bleu(warm) else 1.0
        warmup38.append((lr, word, premise, f"{rate(lr)}: {mean_bleu(short):.2f} / {mean_bleu(warm):.2f} "
                         f"({fraction:.2f}x)", (short, warm)))
    return warmup, warmup38


def lower_of_rates(read):
    """(word, premise, brief) of a rule read at several rates (`fig2_by_rate`'s entries): the lower word of the
    rates, the premise that failed (with its rate) if any, and its brief."""
    words = [r[1] for r in read]
    failed = [r for r in read if r[1] == "not testable"]
    if failed:
        brief = still_falling(failed[0][2]) + f" (at {rate(failed[0][0])})" if len(failed) == 1 else \
            " — curves still falling at both rates"
        return "not testable", "; ".join(f"{rate(r[0])}: {r[2]}" for r in failed), brief
    return max(words, key=("yes", "in direction", "NO").index), CONVERGED, None


def fig2_sgd_row(root, rows, link):
    """Figure 2(c, d)'s row: SGD without warmup against SGD with it, at the rate chosen for SGD with warmup
    (not testable when no rate reaches FIG2_SGD_MIN), and without it at twice that rate."""
    sgd = protocol_arms(root, "fig2")["post-sgd-warmup"]
    grid, best = list(sgd.grid.values()), sgd.rate
    text = f"lr {' / '.join(rate(r['lr']) for r in grid)}: {' / '.join(_f(test_bleu(r)) for r in grid)}"
    paper, claim = "the same effect with SGD (curves only)", "with SGD too, warmup is needed"
    if best is None:
        return judged("Fig 2(c, d)", claim, link, paper,
                      f"SGD with warmup 300, test BLEU at {text}", "not testable",
                      f" — premise: SGD with warmup reaches {FIG2_SGD_MIN:g} BLEU at some rate (fails)",
                      fig2_versions(root, grid))
    with_, without, double = fig2_runs(rows, "post-sgd-warmup", best), fig2_runs(rows, "post-sgd-nowarmup", best), \
        fig2_runs(rows, "post-sgd-nowarmup", 2 * best)

    def spread(found):
        return f"{mean_bleu(found):.2f}" + (f" ({len(found)} seeds)" if len(found) > 1 else "")

    holds = mean_bleu(with_) >= FIG2_SGD_MIN and mean_bleu(without) <= FIG2_COLD_RATIO * mean_bleu(with_)
    return judged("Fig 2(c, d)", claim, link, paper,
                  f"SGD at lr {rate(best)} (best of {len(grid)}): with warmup {spread(with_)}, without "
                  f"{spread(without)}; without at {rate(2 * best)}: {spread(double)}",
                  _verdict(holds, mean_bleu(without) < mean_bleu(with_)),
                  rule((f"with warmup ≥ {FIG2_SGD_MIN:g}; without ≤ {FIG2_COLD_RATIO:g}x that", None)),
                  fig2_versions(root, grid, with_, without, double))


def depth_row(root):
    arms = protocol_arms(root, "depth")
    names = {"post": "Post-LN", "pre": "Pre-LN", "deepnorm": "DeepNorm"}
    label, claim = "DeepNet (Fig 1, Table 1)", ("Post-LN breaks down as depth grows; DeepNorm trains at every depth, "
                                                "at least as well as Pre-LN")
    link, paper = "results/depth/README.md", "Post-LN diverges deep; DeepNorm trains up to 1,000 layers"
    shallow = min(int(re.fullmatch(r"post-(\d+)L", name).group(1)) for name in arms if re.fullmatch(r"post-\d+L", name))
    premise = arms[f"post-{shallow}L"]
    start = premise.grid[premise.rate]
    if test_bleu(start) < DEPTH_MIN_BLEU:
        grid = f"lr {' / '.join(map(rate, premise.grid))}: {' / '.join(_f(test_bleu(r)) for r in premise.grid.values())}"
        return judged(label, claim, link, paper, f"premise: {shallow}-layer Post-LN, test BLEU at {grid}",
                      "not testable", f" — premise: {shallow}-layer Post-LN reaches {DEPTH_MIN_BLEU:g} (fails)",
                      arm_versions(root, "depth", premise))
    depths = sorted({int(name.rsplit("-", 1)[1][:-1]) for name in arms})
    bleu = {(norm, d): seed_bleu(arms[f"{norm}-{d}L"]) for norm in names for d in depths}
    seeds = min(len(arms[f"{norm}-{d}L"].seeds) for norm in names for d in depths)
    deepest = depths[-1]
    diverged = any(r["outcome"] == "diverged" for r in arms[f"post-{deepest}L"].seeds)
    enough = seeds >= DEPTH_SEEDS

    def checks(m):  # m: {(placement, depth): mean test BLEU}
        return (m["post", deepest] <= m["post", shallow] - DEPTH_POST_DROP or diverged,
                all(m[norm, d] >= DEPTH_MIN_BLEU for norm in ("pre", "deepnorm") for d in depths),
                all(m["deepnorm", d] >= m["pre", d] - DEPTH_DEEPNORM_SLACK for d in depths if d >= DEPTH_DEEP))

    def word(means):
        m = {tuple(key.split("|")): value for key, value in means.items()}
        m = {(norm, int(d)): value for (norm, d), value in m.items()}
        return _verdict(all(checks(m)) and enough, m["deepnorm", deepest] >= m["pre", deepest] > m["post", deepest])

    verdict, premise = converged(root, "depth", {f"{norm}|{d}": arms[f"{norm}-{d}L"].seeds for norm in names
                                                 for d in depths}, word,
                                 {f"{norm}|{d}": f"{name} {d}L" for norm, name in names.items() for d in depths})
    post_breaks, others_train, deepnorm_keeps = checks({key: value[0] for key, value in bleu.items()})
    detail = judged_rule(verdict, premise,
                         (f"Post-LN at {deepest} layers diverged or ≥ {DEPTH_POST_DROP:g} below {shallow} layers",
                          post_breaks),
                         (f"Pre-LN, DeepNorm ≥ {DEPTH_MIN_BLEU:g} everywhere", others_train),
                         (f"DeepNorm ≥ Pre-LN − {DEPTH_DEEPNORM_SLACK:g} at {DEPTH_DEEP}+ layers", deepnorm_keeps),
                         (f"{DEPTH_SEEDS} seeds" + ("" if enough else f": {seeds}"), enough))
    beside = [arms[f"deepnorm-torchscale-{d}L"] for d in depths if f"deepnorm-torchscale-{d}L" in arms]
    here = (f"mean of {seeds} seed{'s' if seeds > 1 else ''} at best rates, {' / '.join(map(str, depths))} layers: "
            + ", ".join(f"{name} {' / '.join(_f(bleu[norm, d][0]) for d in depths)}" for norm, name in names.items())
            + ("; torchscale's β " + " / ".join(_f(seed_bleu(a)[0]) for a in beside) if beside else ""))
    return judged(label, claim, link, paper, here, verdict, detail, arm_versions(root, "depth", *arms.values()),
                  brief=still_falling(premise) if verdict == "not testable" else None)


def level_ratios(post_rows, pre_rows):
    """Figure 5(a)'s reading at levels (results/protocols.md, 2026-11-29, 4): for each update of FIG5_LEVELS,
    that update over the first at which Pre-LN's validation loss is at or below Post-LN's loss there
    (interpolated between validation points); None for a level Pre-LN never reaches."""
    post, pre = valid_losses(post_rows), valid_losses(pre_rows)
    ratios = []
    for update in FIG5_LEVELS:
        target = loss_at(post, update)
        reached = next((u for u, loss in pre if loss <= target), None)
        ratios.append(update / reached if reached else None)
    return ratios


def fig5_earlier(root):
    arms = protocol_arms(root, "fig5", "fig5/results.csv")
    post, pre = arms["post-warmup"], arms["pre-no-warmup"]
    curves = _read_csv(root, "fig5/curves.csv")
    entropy = _read_json(root, "fig5/speedup.json").get("unigram_entropy")

    def curve(run):
        return [r for r in curves if r["run"] == run]

    pairs = [(p, next((q for q in pre.seeds if q["seed"] == p["seed"]), None)) for p in post.seeds]
    factors = [loss_ratio(curve(p["run"]), curve(q["run"])) for p, q in pairs if q]
    target = float([r for r in curve(post.seeds[0]["run"]) if r["valid_loss"]][-1]["valid_loss"])
    margin = entropy - target if entropy is not None else None
    testable = margin is not None and margin >= FIG5_MARGIN
    levels = [level_ratios(curve(p["run"]), curve(q["run"])) for p, q in pairs if q]
    level = _mean(sum(levels, [])) if levels and None not in sum(levels, []) else None
    accuracy = _mean(float(r["final_valid_accuracy"]) for r in post.seeds)
    reads = "never" if not any(factors) else " / ".join(f"{f:.1f}x sooner" if f else "never" for f in factors)
    rates = f"{rate(post.rate)} each" if post.rate == pre.rate else f"Post-LN {rate(post.rate)}, Pre-LN {rate(pre.rate)}"
    steps = f"{FIG5_LEVELS[0]}-{FIG5_LEVELS[-1]}"
    here = (f"best rates ({rates}): Post-LN ends "
            + (f"{margin:.2f} nat below the unigram entropy" if margin is not None else "at no recorded entropy")
            + f", masked-LM accuracy {100 * accuracy:.1f} %; Pre-LN reaches its losses of updates {steps} "
            + ("never" if level is None else f"{level:.2f}x sooner") + f", its final one {reads}"
            + (f" ({len(factors)} seeds)" if len(factors) > 1 else ""))
    if not testable:
        word, detail = "not testable", f" — premise: the target ≥ {FIG5_MARGIN:g} nat below the unigram entropy (fails)"
    else:
        word = _verdict(bool(level and level >= FIG5_SPEEDUP), bool(level and level > 1))
        detail = rule((f"≥ {FIG5_SPEEDUP:.1f}x sooner at Post-LN's losses of updates "
                       f"{', '.join(map(str, FIG5_LEVELS))}", bool(level and level >= FIG5_SPEEDUP)),
                      (f"the target ≥ {FIG5_MARGIN:g} nat below the unigram entropy", True))
    return judged("Fig 5(a)", "BERT Pre-LN without warmup reaches Post-LN's validation loss sooner", "results/fig5/README.md",
                  f"500k against 700k updates, {FIG5_SPEEDUP:.1f}x (BERT-base)", here, word, detail,
                  versions(root, *(f"fig5/results.csv:{r['run']}" for arm in (post, pre)
                                   for r in [*arm.grid.values(), *arm.seeds])), "bert")


# --- the converged protocol on the CPU (results/protocols.md, 2026-12-02) ------------------------------
# Figures 2, 4 and 5(a) are read on runs trained to their plateaus once every run of the experiment has
# ended; until then, and where a run reached the cap, "not testable at this scale", the earlier reading
# (on curves still falling) beside it as superseded.

SUPERSEDED = "superseded (results/protocols.md, 2026-12-02), the earlier reading on curves still falling"
Plateaus = collections.namedtuple("Plateaus", "name arms ended runs capped")  # arms: {arm: [run, one a seed]}


def plateau_runs(root, name):
    """`Plateaus` of the converged experiment `name`: each arm's ended runs (their RUN.json with arm, lr and
    seed), as results/NAME publishes them run by run, how many of its runs have ended and it has in all,
    and the name of each run that reached the cap without a plateau."""
    listed = _read_csv(root, f"{name}/runs-{name}.csv") if os.path.exists(
        os.path.join(root, "results", name, f"runs-{name}.csv")) else []
    arms = {}
    for row in listed:
        if os.path.exists(os.path.join(root, "results", name, f"{row['run']}.json")):
            found = dict(_read_json(root, f"{name}/{row['run']}.json"), run=row["run"], arm=row["arm"],
                         lr=float(row["lr"]), seed=int(row["seed"]))
            arms.setdefault(row["arm"], []).append(found)
    specs = {run.name: run.spec for run in EXPERIMENTS[name].runs}
    ended = [run for runs in arms.values() for run in runs]
    for run in ended:  # a linear decay's last update is the end of its schedule, not a cap (2026-12-06)
        run["schedule_end"] = not run.get("plateau_at") and ends_at_the_cap(specs[run["run"]])
    capped = [run["run"] for run in ended
              if run.get("outcome") != "diverged" and not run.get("plateau_at") and not run["schedule_end"]]
    return Plateaus(name, {arm: sorted(runs, key=lambda r: r["seed"]) for arm, runs in arms.items()}, len(ended),
                    len(EXPERIMENTS[name].runs), capped)


def stop_text(run):
    """Where a converged run stopped: "plateau at 3,328", "decayed to 0 at 6,144" (a linear decay's end),
    "cap (6,144)" or "diverged at 212"."""
    if run.get("outcome") == "diverged":
        return f"diverged at {run['updates']:,}"
    if run.get("plateau_at"):
        return f"plateau at {run['plateau_at']:,}"
    return f"decayed to 0 at {run['updates']:,}" if run.get("schedule_end") else f"cap ({run['updates']:,})"


def plateau_versions(root, plateaus):
    return versions(root, *(f"{plateaus.name}/{run['run']}.json" for runs in plateaus.arms.values() for run in runs))


def pending(earlier, plateaus, root):
    """`earlier` (a Row read on curves still falling) as the converged protocol reads it while its runs have
    not all ended, or where some reached the cap: not testable, the earlier reading beside it, superseded."""
    capped = ", ".join(plateaus.capped)
    if plateaus.ended < plateaus.runs:
        why = (f"trained to its plateau: {plateaus.ended} of {plateaus.runs} runs of `{plateaus.name}` ended "
               f"(`python reproduce.py --only {plateaus.name}`)"
               + (f", {len(plateaus.capped)} of them at the cap without a plateau ({capped}), which the runs left "
                  "cannot change" if plateaus.capped else ""))
        brief = f" — the converged runs: {plateaus.ended} of {plateaus.runs} ended" + (
            f", {len(plateaus.capped)} at the cap without a plateau" if plateaus.capped else "")
    else:
        why = f"trained to its plateau (fails): reached the cap without a plateau: {capped}"
        brief = f" — {len(plateaus.capped)} of {plateaus.runs} runs reached the cap without a plateau"
    detail = f" — premise: {why}; {SUPERSEDED}: {earlier.word}{earlier.detail}"
    found = {**earlier.found, **plateau_versions(root, plateaus)}
    return again(earlier, earlier.here, "not testable", detail, found, brief)


def again(earlier, here, word, detail, found, brief=None):
    """`earlier`'s claim (its label, claim, link, paper and job) judged again, on `found`."""
    return judged(earlier.label, earlier.claim[len(earlier.label) + 2:], earlier.link, earlier.paper, here, word,
                  detail, found, earlier.job, brief)


def settled(row, earlier):
    """`row`, read at the plateau, with `earlier` (its reading on curves still falling) after it on the row's page,
    superseded; the README's table keeps the row's own reason."""
    return row._replace(detail=f"{row.detail}; {SUPERSEDED} (measured {earlier.measured_on}): {earlier.here}: "
                               f"{earlier.word}{earlier.detail}")


def at_plateau(plateaus):
    """Whether the converged experiment's readings stand: every run ended, none at the cap."""
    return plateaus.ended == plateaus.runs and not plateaus.capped


def stops(plateaus, names=None):
    """Each arm's stops, for a row's text: "Post-LN 2,944 / 3,200 / cap"."""
    def short(run):
        return stop_text(run).replace("plateau at ", "")
    return "; ".join(f"{(names or {}).get(arm, arm)} {' / '.join(short(r) for r in runs)}"
                     for arm, runs in plateaus.arms.items())


def first_at(points, level, better=-1):
    """The first update at which the curve [(update, value)] reaches `level` (at or below it where lower is
    better, `better` -1; at or above, +1), interpolated linearly between the validation points around it;
    None if it never does."""
    for i, (update, value) in enumerate(points):
        if better * (value - level) >= 0:
            if i == 0 or value == points[i - 1][1]:
                return float(update)
            before, was = points[i - 1]
            return before + (level - was) / (value - was) * (update - before)
    return None


LEVEL_SHARES = (0.25, 0.5, 0.75, 1.0)  # the levels: the reference's values at these shares of its updates to L*


def shared_levels(reference, other, better=-1):
    """The updates `other` needs over those `reference` needs at levels both curves reach
    (results/protocols.md, 2026-12-02, 5): L* is the worse of the two best values; the levels are the
    reference's values at LEVEL_SHARES of the updates at which it first reaches L*. [ratio per level]."""
    best = min if better < 0 else max
    target = (max if better < 0 else min)(best(v for _, v in reference), best(v for _, v in other))
    end = first_at(reference, target, better)
    ratios = []
    for share in LEVEL_SHARES:
        level = loss_at(reference, share * end) if share < 1 else target
        mine, theirs = first_at(other, level, better), first_at(reference, level, better)
        ratios.append(mine / theirs if mine and theirs else None)
    return ratios


def curve_points(root, folder, run, key):
    """[(update, value)] of a run's metrics (results/FOLDER/RUN.csv) that record `key`."""
    return [(int(r["updates"]), float(r[key])) for r in _read_csv(root, f"{folder}/{run['run']}.csv")
            if r.get(key) not in (None, "") and float(r[key]) == float(r[key])]


def faster_ratios(root, plateaus, fast, slow, key, better):
    """The mean over seeds and levels of `fast`'s updates over `slow`'s at the levels both reach
    (`shared_levels`), by metric `key`; None where some level is never reached."""
    ratios = []
    for run in plateaus.arms[fast]:
        other = next(r for r in plateaus.arms[slow] if r["seed"] == run["seed"])
        ratios += shared_levels(curve_points(root, plateaus.name, other, key),
                                curve_points(root, plateaus.name, run, key), better)
    return _mean(ratios) if ratios and None not in ratios else None


def converged_means(plateaus):
    """{arm: (mean test BLEU over its seeds, its text with the range)} of a converged experiment."""
    return {arm: seed_bleu(Arm(arm, {}, None, runs)) for arm, runs in plateaus.arms.items()}


def as_well_row(root):
    """Sec 4 and Fig 4's "as well as" at the plateau (`fig4-converged`); before, `as_well_earlier`."""
    earlier, plateaus = as_well_earlier(root), plateau_runs(root, "fig4-converged")
    if not at_plateau(plateaus):
        return pending(earlier, plateaus, root)
    means = converged_means(plateaus)
    gap = means["pre-adam-nowarmup"][0] - means["post-adam-warmup"][0]
    here = (f"at the plateau, mean of 3 seeds: Pre-LN without warmup {means['pre-adam-nowarmup'][1]}, Post-LN with "
            f"warmup {means['post-adam-warmup'][1]}: {gap:+.2f} (stops: "
            f"{stops(plateaus._replace(arms={a: plateaus.arms[a] for a in ('pre-adam-nowarmup', 'post-adam-warmup')}), FIG4_NAMES)})")
    return settled(again(earlier, here, _verdict(gap >= -FIG4_AS_WELL, False),
                         rule((f"mean ≥ Post-LN with warmup's − {FIG4_AS_WELL:g}, each arm at its plateau",
                               gap >= -FIG4_AS_WELL)), plateau_versions(root, plateaus)), earlier)


def fig4_protocol_rows(root):
    """Figure 4's "and faster" and RAdam rows at the plateau (`fig4-converged`); before, `fig4_earlier`."""
    earlier, plateaus = fig4_earlier(root), plateau_runs(root, "fig4-converged")
    if not at_plateau(plateaus):
        return [pending(row, plateaus, root) for row in earlier]
    faster, radam = earlier
    by_bleu = faster_ratios(root, plateaus, "pre-adam-nowarmup", "post-adam-warmup", "valid_bleu", +1)
    by_loss = faster_ratios(root, plateaus, "pre-adam-nowarmup", "post-adam-warmup", "valid_loss", -1)
    both = (by_bleu, by_loss)

    def text(ratio):
        return "never at some level" if ratio is None else f"{ratio:.2f}x"
    found = plateau_versions(root, plateaus)
    faster_row = again(faster, f"at the levels both reach, 3 seeds: Pre-LN needs {text(by_loss)} Post-LN's updates by "
                               f"validation loss, {text(by_bleu)} by greedy BLEU",
                       _verdict(all(x is not None and x <= FIG4_FASTER for x in both),
                                all(x is not None and x < 1 for x in both)),
                       rule((f"by loss, mean within {FIG4_FASTER:g}x the updates", bool(by_loss and by_loss <= FIG4_FASTER)),
                            ("by BLEU, the same", bool(by_bleu and by_bleu <= FIG4_FASTER))), found)
    means = converged_means(plateaus)
    post_gap = means["post-radam"][0] - means["post-adam-warmup"][0]
    pre_gap = means["pre-radam"][0] - means["pre-adam-nowarmup"][0]
    fixed = means["post-radam"][0] - means["post-adam-nowarmup"][0]
    word = radam_verdict(post_gap, pre_gap, fixed)
    radam_row = again(radam, f"at the plateau, means of 3 seeds: Post-LN + RAdam {_f(means['post-radam'][0])}, "
                             f"{post_gap:+.2f} against Adam with warmup, {fixed:+.2f} against Adam without; Pre-LN + "
                             f"RAdam {_f(means['pre-radam'][0])}, {pre_gap:+.2f} against Adam",
                      word, rule((f"Post-LN ≥ Adam with warmup − {RADAM_POST_GAP:g}", post_gap >= -RADAM_POST_GAP),
                                 (f"Pre-LN within {RADAM_PRE_GAP:g} of Adam", abs(pre_gap) <= RADAM_PRE_GAP),
                                 ("in direction if above Adam without warmup", None)), found,
                      brief=f" — Post-LN + RAdam {fixed:+.2f} against Adam without warmup, {post_gap:+.2f} against Adam with it")
    return [settled(faster_row, faster), settled(radam_row, radam)]


def fig2_warmup_row(root, earlier):
    """Figure 2's "Post-LN needs warmup" at the plateau (`fig2-converged`), each rate on its 3 seeds' means,
    the lower word of the rates; before, `earlier`."""
    plateaus = plateau_runs(root, "fig2-converged")
    if not at_plateau(plateaus):
        return pending(earlier, plateaus, root)
    words, texts = [], []
    for lr in FIG2_RATES:
        m = {arm: _mean(test_bleu(r) for r in plateaus.arms[arm] if r["lr"] == lr)
             for arm in ("post-warmup", "post-nowarmup", "pre-nowarmup")}
        words.append(fig2_needs_warmup(m))
        ratio = m["post-nowarmup"] / m["post-warmup"] if m["post-warmup"] else 1.0
        texts.append(f"{rate(lr)}: {m['post-warmup']:.2f} / {m['post-nowarmup']:.2f} ({ratio:.2f}x), Pre-LN "
                     f"{m['pre-nowarmup']:.2f}")
    word = max(words, key=("yes", "in direction", "NO").index)
    return settled(again(earlier, "at the plateau, Adam, 3 seeds, Post-LN with / without warmup: " + "; ".join(texts),
                         word, rule((f"at each rate: with warmup ≥ {FIG2_POST_MIN:g}; without ≤ {FIG2_COLD_RATIO:g}x "
                                     "that; the lower word of the rates", None)), plateau_versions(root, plateaus)),
                   earlier)


def fig5_row(root):
    """Figure 5(a) at the plateau (`fig5-converged`): the premise, then Post-LN's updates over Pre-LN's at the
    levels both reach; before, `fig5_earlier`."""
    earlier, plateaus = fig5_earlier(root), plateau_runs(root, "fig5-converged")
    if not at_plateau(plateaus):
        return pending(earlier, plateaus, root)
    post, pre = plateaus.arms["post-warmup"], plateaus.arms["pre-no-warmup"]
    margin = _mean(float(r["unigram_entropy"]) - float(r["final_valid_loss"]) for r in post)
    speedup = faster_ratios(root, plateaus, "post-warmup", "pre-no-warmup", "valid_loss", -1)
    here = (f"at the plateau, 3 seeds: Post-LN ends {margin:.2f} nat below the unigram entropy; Pre-LN reaches the "
            f"levels both reach " + ("never at some level" if speedup is None else f"{speedup:.2f}x sooner"))
    if margin < FIG5_MARGIN:
        word, detail = "not testable", f" — premise: the target ≥ {FIG5_MARGIN:g} nat below the unigram entropy (fails)"
    else:
        word = _verdict(bool(speedup and speedup >= FIG5_SPEEDUP), bool(speedup and speedup > 1))
        detail = rule((f"≥ {FIG5_SPEEDUP:.1f}x sooner at the levels both reach", bool(speedup and speedup >= FIG5_SPEEDUP)),
                      (f"the target ≥ {FIG5_MARGIN:g} nat below the unigram entropy", True))
    return settled(again(earlier, here, word, detail, plateau_versions(root, plateaus)), earlier)


def plateau_page(name):
    """A results page's table of a converged experiment (results/protocols.md, 2026-12-02): every run ended so
    far, where it stopped (its plateau, or the cap), its final validation loss and test BLEU; its curves are
    results/NAME/curves-NAME.png once every run has ended."""
    def make(root):
        plateaus, figure = plateau_runs(root, name), EXPERIMENTS[name].figures[0]
        lines = [f"`python reproduce.py --only {name}`: {plateaus.ended} of {plateaus.runs} runs ended"
                 + (f", {len(plateaus.capped)} at the cap without a plateau" if plateaus.capped else "")
                 + (f"; curves of every arm to its stop: [{figure}](../{name}/{figure})"
                    if os.path.exists(os.path.join(root, "results", name, figure))
                    and plateaus.ended == plateaus.runs else "") + "."]
        if plateaus.ended:
            loss = "final masked-LM loss" if EXPERIMENTS[name].job == "bert" else "final valid loss / test BLEU"
            lines += ["", f"| arm | lr | seed | stopped | {loss} |", "| --- | --- | --- | --- | --- |"]
            for arm, runs in plateaus.arms.items():
                for run in runs:
                    score = (f"{final_loss(run):.3f}" + ("" if EXPERIMENTS[name].job == "bert" else f" / {_f(test_bleu(run))}")
                             if final_loss(run) < float("inf") else "diverged")
                    lines.append(f"| {arm} | {rate(run['lr'])} | {run['seed']} | {stop_text(run)} | {score} |")
        return "\n".join(lines)
    return make


ROW_FUNCTIONS = ("as_well_row", "fig2_rows", "analysis_rows", "fig4_protocol_rows", "fig5_rows", "depth_row")


def results_rows(root):
    """The rows of the README's Results table (`Row`s), in the order of ROW_FUNCTIONS."""
    return [row for name in ROW_FUNCTIONS for made in [globals()[name](root)]
            for row in (made if isinstance(made, list) else [made])]


# --- which rule and protocol judged each row (results/protocols.md, 2026-11-29, 8) ------------------------

RULES = os.path.join("results", "rules.json")


def _closure(path, names):
    """The statements of the module-level functions and assignments of the Python file `path` that `names` use,
    directly or through each other (comments and docstrings left out), keyed by name."""
    with open(path, encoding="utf-8") as f:
        source = f.read()
    tree, lines = ast.parse(source), source.splitlines(keepends=True)  # split once, not per definition
    defined = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defined[name.id] = node
    found, todo = {}, list(names)
    while todo:
        name = todo.pop()
        if name in found or name not in defined:
            continue
        node = defined[name]
        found[name] = rundir.statements_only("".join(lines[node.lineno - 1:node.end_lineno]))  # its whole lines
        local = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} | \
                {a.arg for n in ast.walk(node) if isinstance(n, ast.arguments)
                 for a in n.posonlyargs + n.args + n.kwonlyargs + [n.vararg, n.kwarg] if a}
        local = local if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else set()
        todo += [n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id not in local]
    return found


def rule_hash(function):
    """12 hex digits of SHA-256 over what judges the rows of `function` (a name of ROW_FUNCTIONS): its code and
    the constants and helpers it uses here, and the protocols of the experiments it judges (reproduction/experiments.py:
    their functions and constants)."""
    protocols = [e.protocol.__name__ for e in EXPERIMENTS.values() if function in e.rows and e.protocol]
    parts = {**_closure(__file__, [function]),
             **{f"experiments.{k}": v for k, v in _closure(os.path.join(ROOT, "reproduction", "experiments.py"),
                                                               protocols).items()}}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode("utf-8")).hexdigest()[:12]


def recorded_rules(root):
    return _json_or(root, "rules.json", {})


def record_rules(root, functions, when):
    """Record the rule hash of `functions` (names of ROW_FUNCTIONS) as the one their verdicts were published
    under, on `when` (reproduce.py, as it publishes an experiment; `--publish`)."""
    held = recorded_rules(root)
    held.update({name: dict(hash=rule_hash(name), published=when) for name in functions})
    with open(os.path.join(root, RULES), "w", encoding="utf-8") as f:
        json.dump(dict(sorted(held.items())), f, indent=1)
        f.write("\n")


def changed_rules(root):
    """[(function, recorded hash, today's, published)] of the rows whose rule or protocol changed since their
    verdicts were published."""
    held = recorded_rules(root)
    today = {name: rule_hash(name) for name in ROW_FUNCTIONS}
    return [(name, held.get(name, {}).get("hash"), today[name], held.get(name, {}).get("published"))
            for name in ROW_FUNCTIONS if held.get(name, {}).get("hash") != today[name]]


WORDS = ("yes", "in direction", "NO", "not testable")


def tally(rows):
    """One line: how many claims got each verdict, and how many rows are stale."""
    counts = collections.Counter(row.word for row in rows)
    stale = [row for row in rows if row.stale]
    line = f"{len(rows)} claims: " + ", ".join(f"{counts[word]} {word}" for word in WORDS if counts[word])
    if not stale:
        return line + "; none stale."
    if len(stale) == len(rows):
        return line + (f"; all {len(rows)} stale (measured on other code than today's: each says what its numbers "
                       "would give).")
    return line + f"; {len(stale)} stale ({', '.join(dict.fromkeys(row.label for row in stale))})."


def measured_line(rows):
    """One line: each code fingerprint the rows were measured on, with its dates and the rows it measured."""
    groups = {}
    for row in rows:
        for fp, measured in row.found.items():
            dates, labels = groups.setdefault(fp, (set(), {}))
            dates.update(measured)
            labels[row.label] = None
    everyone = list(dict.fromkeys(row.label for row in rows))
    parts = []
    for fp, (dates, labels) in sorted(groups.items(), key=lambda item: (-len(item[1][1]), str(item[0]))):
        others = [label for label in everyone if label not in labels]
        who = ("every row" if not others else "all but " + ", ".join(others) if len(others) < len(labels)
               else ", ".join(labels))
        parts.append(f"{'code `' + fp + '`' if fp else 'code not recorded'} ({date_span(dates)}: {who})")
    certified = any(not row.stale and any(fp != TODAY for fp in row.found) for row in rows)
    return "Measured on " + "; ".join(parts) + "." + (
        " Today's code is certified to give the same numbers, bit for bit, by the numerics check "
        "(`python reproduce.py --certify`, `results/certify/`)." if certified else "")


def results_table(root):
    rows = results_rows(root)
    lines = [tally(rows), "", "| claim | paper | here | verdict |", "| --- | --- | --- | --- |"]
    for row in rows:
        verdict = ("stale: would be " if row.stale else "") + f"**{row.word}**" + row.brief
        lines.append(f"| [{row.label}]({row.link}): {row.claim[len(row.label) + 2:]} | {row.paper} | {row.here} | "
                     f"{verdict} |")
    return "\n".join(lines + ["", measured_line(rows)])


def page_verdicts(link):
    """A results page's verdicts in full (the README's table gives a brief reason): each row that links to
    the page, with its rule and every check, or the premise that failed with its numbers."""
    def make(root):
        rows = [row for row in results_rows(root) if row.link == link]
        return "\n".join(f"- **{row.claim}**: " + ("stale: would be " if row.stale else "") + f"**{row.word}**"
                         + row.detail + f" (measured: {row.measured_on})" for row in rows) or "No row reads this page yet."
    return make


def stale_runs(root):
    """The rows of the Results table measured on other code than today's: [(claim, measured on)]."""
    return [(row.claim, row.measured_on) for row in results_rows(root) if row.stale]


def main_run(root):
    """The main command's time and scores, as results/main/ holds them (results.json, timing.json): the one
    set of timings the README and docs/translation.md quote."""
    result, timing = _json_or(root, "main/results.json", None), _json_or(root, "main/timing.json", {}).get("main", {})
    if result is None:
        return "not measured yet: `python reproduce.py --only main`."
    measured = (result.get("code_version") or {}).get("measured", "?")
    wall = f"{timing['wall_s'] / 60:.1f} min in all, " if timing.get("wall_s") else ""
    host = f" on a 2-core {timing['cpu']}" if timing.get("cpu") else " on 2 cores"
    compiled = (f", {result['compile_s']:.0f} s compiling {result['compile_programs']} programs"
                if result.get("compile_s") is not None else "")
    return (f"{wall}{result['train_minutes']:.1f} of them training{host} (jax{compiled}; `reproduce.py --only main`,"
            f" {measured}), ending with test BLEU {result['test_bleu']:.2f} (sacrebleu, with its signature) and "
            f"{result['test_tokenized_bleu']:.2f} tokenized (`results/main/`).")


# --- detail tables ------------------------------------------------------------------------------------

# file -> {table name: function of the repository root}
TABLES = {
    "README.md": {"results": results_table, "main-run": main_run},
    "docs/translation.md": {"main-run": main_run},
    "results/fig2/README.md": {"fig2-verdicts": page_verdicts("results/fig2/README.md"), "fig2-runs": protocol_page("fig2"),
                               "fig2-converged": plateau_page("fig2-converged")},
    "results/fig4/README.md": {"fig4-verdicts": page_verdicts("results/fig4/README.md"), "fig4-grid": protocol_page("fig4"),
                               "fig4-converged": plateau_page("fig4-converged")},
    "results/fig5/README.md": {"fig5-verdicts": page_verdicts("results/fig5/README.md"),
                               "fig5-converged": plateau_page("fig5-converged")},
    "docs/bert.md": {"fig5": protocol_page("fig5", table="fig5/results.csv")},
    "results/depth/README.md": {"depth-verdicts": page_verdicts("results/depth/README.md"),
                                "depth-runs": protocol_page("depth"), "depth-matched": depth_matched},
}


def render(text, name, table):
    """`text` with the block between the markers of `name` replaced by `table`."""
    pattern = re.compile(rf"(<!-- generated: {re.escape(name)} -->\n)(?:.*?\n)?(<!-- end: {re.escape(name)} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"no '<!-- generated: {name} -->' ... '<!-- end: {name} -->' block; add the two marker lines")
    return pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only check; exit 1 if a table differs from the files or a row ran on other code")
    parser.add_argument("--allow-stale", action="store_true",
                        help="with --check: rows measured on other code pass (the table marks them stale)")
    parser.add_argument("--root", default=ROOT, help="the repository (default: the one this file is in)")
    parser.add_argument("--publish", metavar="ROWS", help="record the rule of these row functions (comma-separated, "
                        f"of {', '.join(ROW_FUNCTIONS)}; or all) as the one their verdicts are published under "
                        "(results/rules.json): after the protocol that changes a rule is committed")
    args = parser.parse_args(argv)
    if args.publish:
        names = list(ROW_FUNCTIONS) if args.publish == "all" else [n.strip() for n in args.publish.split(",")]
        unknown = [n for n in names if n not in ROW_FUNCTIONS]
        if unknown:
            print(f"tables.py: error: --publish {','.join(unknown)}: no such row function; choose from "
                  f"{', '.join(ROW_FUNCTIONS)} or all", file=sys.stderr)
            return 2
        record_rules(args.root, names, datetime.date.today().isoformat())
    stale = []
    for path, tables in TABLES.items():
        full = os.path.join(args.root, path)
        with open(full, encoding="utf-8") as f:
            old = f.read()
        new = old
        for name, make in tables.items():
            new = render(new, name, make(args.root))
        if new != old:
            stale.append(path)
            if not args.check:
                with open(full, "w", encoding="utf-8") as f:
                    f.write(new)
    if args.check and stale:  # and on, so that one --check names every problem
        print(f"stale generated tables in {', '.join(stale)}: run python results/tables.py", file=sys.stderr)
    moved = changed_rules(args.root)
    if moved:
        print("the rule or protocol of these rows changed since their verdicts were published (results/rules.json); "
              "commit the protocol that changes it, then re-read them with python results/tables.py --publish ROWS:\n"
              + "\n".join(f"  {name}: {was or 'never recorded'} -> {now}" + (f" (published {when})" if when else "")
                          for name, was, now, when in moved), file=sys.stderr)
    if args.check and (stale or moved):
        return 1
    old_code = stale_runs(args.root)
    if old_code:
        rows = f"{len(old_code)} row{'s' if len(old_code) > 1 else ''}"
        print(f"{rows} of the Results table ran on other code than today's ({TODAY}); re-run them:\n"
              + "\n".join(f"  {claim}: {when}" for claim, when in old_code), file=sys.stderr)
        if args.check and not args.allow_stale:
            return 1
    print(("rewrote " + ", ".join(stale)) if stale and not args.check else "tables up to date")
    return 0

