"""The README's Results table and the sweeps' detail tables say what the files in results/ say."""

import csv
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from conftest import once
from harness import rundir
from reproduction import experiments
from reproduction import tables as rules
from harness.files import read_csv

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = once("tables read from results/ by a script", backend="tensorflow")
SCRIPT = os.path.join(ROOT, "results", "tables.py")


def tables(*argv):
    return subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True)


def test_generated_tables_are_up_to_date():
    # A change that moves numbers may mark the rows it affects stale instead of re-measuring them at once,
    # so the suite accepts stale rows that say so; plain --check (which fails on any) is the release check.
    done = tables("--check", "--allow-stale")
    assert done.returncode == 0, done.stderr


def _copy(tmp_path):
    shutil.copytree(os.path.join(ROOT, "results"), tmp_path / "results")
    shutil.copytree(os.path.join(ROOT, "docs"), tmp_path / "docs")
    shutil.copy(os.path.join(ROOT, "README.md"), tmp_path / "README.md")


def _clear(folder):
    """Remove the files of a copied results folder (the runs the campaign has published so far, their figure),
    keeping its subfolders (earlier readings, superseded)."""
    for path in folder.iterdir():
        if path.is_file():
            path.unlink()


def _settle(root, folder):
    """Every curve of results/FOLDER flat over its last quarter: the convergence premise (results/protocols.md,
    2026-11-29) holds, and the rules read the numbers alone."""
    for path in (root / "results" / folder).glob("*.csv"):
        rows = list(csv.DictReader(open(path)))
        if not rows or "valid_loss" not in rows[0] or "run" in rows[0]:
            continue
        end = int(rows[-1]["updates"])
        for row in rows:
            if int(row["updates"]) >= 0.7 * end:
                row["valid_loss"] = rows[-1]["valid_loss"]
        _write_csv(path, rows, list(rows[0]))


def _write_csv(path, rows, fields):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def _edit_csv(path, change):
    rows = list(csv.DictReader(open(path)))
    fields = list(dict.fromkeys([*rows[0], "code_version", "measured"]))
    for row in rows:
        change(row)
    _write_csv(path, rows, fields)


def _lines(root):
    readme = (root / "README.md").read_text()
    return readme.split("<!-- generated: results -->\n")[1].split("<!-- end: results -->")[0].splitlines()


def _row(root, label):
    """The Results table's row whose claim cell links `label`."""
    return next(line for line in _lines(root) if line.startswith(f"| [{label}]("))


def _cells(line):
    """A table row's cells (an escaped "\|" stays inside its cell)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]


def _verdict(root, label):
    """The row's verdict in full, as its page gives it (the README's table gives a brief reason)."""
    link = re.match(r"\| \[[^]]+\]\(([^)]+)\)", _row(root, label)).group(1)
    with open(os.path.join(root, link), encoding="utf-8") as f:
        full = next(line for line in f if line.startswith(f"- **{label}: "))
    return re.sub(r" \(measured: [^)]*\)$", "", full.rstrip("\n").split("**: ", 1)[1])


def _fig2_ended(root):
    """How many of Figure 2's converged runs are published under `root` (results/fig2-converged/), as the
    campaign has them so far."""
    path = os.path.join(root, "results", "fig2-converged", "runs-fig2-converged.csv")
    return len(read_csv(path)) if os.path.isfile(path) else 0


def _fig2_capped(root):
    """How many of those reached the cap without a plateau (their RUN.json has no plateau_at)."""
    folder = os.path.join(root, "results", "fig2-converged")
    listed = read_csv(os.path.join(folder, "runs-fig2-converged.csv"))
    results = [json.loads(open(os.path.join(folder, f"{row['run']}.json")).read()) for row in listed]
    return sum(result.get("outcome") != "diverged" and not result.get("plateau_at") for result in results)


def _earlier(root, label):
    """The row's earlier reading, on curves still falling, that its converged runs supersede while they have
    not all ended (results/protocols.md, 2026-12-02), in the form of a verdict: "**WORD** — ..."."""
    full = _verdict(root, label)
    stale = "stale: would be " if full.startswith("stale: would be ") else ""
    assert "**not testable** — premise: trained to its plateau" in full, full
    word, rest = re.match(r"(yes|in direction|NO|not testable)( — .*)$",
                          full.split("the earlier reading on curves still falling: ", 1)[1]).groups()
    return f"{stale}**{word}**{rest}"


def _measured(root):
    return next(line for line in _lines(root) if line.startswith("Measured on "))


def _tally(root):
    """{verdict: count} of the tally line above the table, with "claims" and "stale" (0 for none)."""
    line = _lines(root)[0]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (yes|in direction|NO|not testable)\b", line)}
    counts["claims"] = int(re.match(r"(\d+) claims: ", line).group(1))
    stale = re.search(r"; (?:all )?(\d+) stale", line)
    counts["stale"] = int(stale.group(1)) if stale else 0 if "; none stale." in line else None
    return counts, line


def test_the_table_is_one_row_a_claim_with_short_cells_and_a_tally():
    root = pathlib.Path(ROOT)
    rows = [line for line in _lines(root) if line.startswith("| [")]
    assert "| claim | paper | here | verdict |\n| --- | --- | --- | --- |" in "\n".join(_lines(root))
    counts, line = _tally(root)
    assert counts["claims"] == len(rows) == sum(counts.get(w, 0) for w in ("yes", "in direction", "NO", "not testable"))
    stale = 0
    for row in rows:
        claim, paper, here, verdict = _cells(row)
        link = re.match(r"\[[^]]+\]\(([^)]+)\): \S", claim).group(1)
        assert link.startswith("results/") and os.path.exists(os.path.join(ROOT, link)), row
        assert len([w for w in here.split() if re.search(r"\w", w)]) <= 30, here  # the rest is on the results page
        assert paper and len(paper.split()) <= 16, paper
        word = re.match(r"(stale: would be )?\*\*(yes|in direction|NO|not testable)\*\*( — |$)", verdict)
        assert word, verdict
        stale += bool(word.group(1))
        # "passes" and "fails" are said only of a rule's checks
        assert not re.search(r"\b(pass|fail)", claim + paper + here), row
        assert not re.sub(r" \((passes|fails)\)", "", verdict).count("pass") and "fail" not in re.sub(
            r" \((passes|fails)\)", "", verdict), verdict
    assert counts["stale"] == stale
    assert _measured(root).startswith("Measured on code `")


def test_a_changed_result_makes_the_table_stale_and_the_rule_judges_it(tmp_path):
    _copy(tmp_path)
    # Figure 2's rows read its converged runs too, measured on codes of their own: left out here, so that
    # the edited results below are all that Figure 2's rows are measured on
    shutil.rmtree(tmp_path / "results" / "fig2-converged", ignore_errors=True)
    today = rundir.code_version()["fingerprint"]
    before, _ = _tally(tmp_path)
    fig2_rows = [line for line in _lines(tmp_path) if line.startswith(("| [Fig 2 (Sec 3)](", "| [Fig 2(c, d)]("))]
    were_stale = sum(_cells(line)[3].startswith("stale") for line in fig2_rows)
    # at both of the paper's rates, each read on its three seeds: 7.0 is 0.28x 25.0, and the rule's 0.4x holds
    # (with a margin: the premise projects what the last quarter's fall could still add)
    scores = {f"{arm}-lr{lr}{seed}": value for lr in ("1e-3", "5e-4") for seed in ("", "-seed2", "-seed3")
              for arm, value in (("post-warmup", {"": "25.0", "-seed2": "24.0", "-seed3": "26.0"}[seed]),
                                 ("post-nowarmup", "7.0"))}

    def change(row):
        row["test_tokenized_bleu"] = scores.get(row["run"], row["test_tokenized_bleu"])
        row["code_version"], row["measured"] = today, "2026-01-02"

    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", change)
    _settle(tmp_path, "fig2")
    stale = tables("--check", "--allow-stale", "--root", str(tmp_path))
    assert stale.returncode == 1 and "README.md" in stale.stderr
    assert tables("--root", str(tmp_path)).returncode == 0
    here = _cells(_row(tmp_path, "Fig 2 (Sec 3)"))[2]
    assert "Post-LN with / without warmup: 1e-3: 25.00 / 7.00 (0.28x)" in here and "5e-4: 25.00 / 7.00" in here
    assert _earlier(tmp_path, "Fig 2 (Sec 3)") == ("**yes** — rule: at each rate: with warmup ≥ 20 (passes); "
                                                   "without ≤ 0.4x that; the lower word of the rates (passes); the "
                                                   "training left cannot change it (passes)")
    assert _cells(_row(tmp_path, "Fig 2 (Sec 3)"))[3] == (
        f"**not testable** — the converged runs: {_fig2_ended(tmp_path)} of 18 ended")
    # The "measured on" line: today's code, with the new date, and no other code for Fig 2's rows.
    segments = _measured(tmp_path).removeprefix("Measured on ").split("; code ")
    mine = [s for s in segments if f"`{today}`" in s]
    assert len(mine) == 1 and "2026-01-02" in mine[0], segments
    # no other code claims Fig 2's rows (a segment "all but A, B" names the rows it does not hold)
    assert not [s for s in segments if s is not mine[0] and "Fig 2 (Sec 3)" in s.split("all but")[0]], segments
    fresh, line = _tally(tmp_path)
    assert "Fig 2 (Sec 3)" not in line and fresh["stale"] == before["stale"] - were_stale
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 0

    scores.update({run: "10.5" for run in scores if run.startswith("post-nowarmup")})  # 0.42x: just outside the
    # rule, so only the direction agrees
    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", change)
    assert tables("--root", str(tmp_path)).returncode == 0
    assert "25.00 / 10.50 (0.42x)" in _cells(_row(tmp_path, "Fig 2 (Sec 3)"))[2]
    assert _earlier(tmp_path, "Fig 2 (Sec 3)").startswith("**in direction** — rule: at each rate: with warmup ≥ 20 "
                                                         "(passes); without ≤ 0.4x that; the lower word of the rates "
                                                         "(fails)")
    after, _ = _tally(tmp_path)  # the row reads "not testable" until its converged runs end: the tally stays
    assert after == fresh


def test_a_row_from_other_code_is_marked_stale_and_fails_the_plain_check(tmp_path):
    _copy(tmp_path)
    today = rundir.code_version()["fingerprint"]

    def change(row):
        row["code_version"], row["measured"] = today, "2026-01-02"

    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", change)
    assert tables("--root", str(tmp_path)).returncode == 0
    assert "stale" not in _verdict(tmp_path, "Fig 2 (Sec 3)")

    def older(row):
        row["code_version"] = "0123456789ab"

    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", older)
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 1  # the README does not say so yet
    assert tables("--root", str(tmp_path)).returncode == 0
    assert _earlier(tmp_path, "Fig 2 (Sec 3)").startswith("stale: would be **not testable** — premise: 1e-3: the "
                                                         "training left")
    assert "code `0123456789ab` (2026-01-02: Fig 2 (Sec 3), Fig 2(c, d))" in _measured(tmp_path)
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 0
    plain = tables("--check", "--root", str(tmp_path))
    assert plain.returncode == 1 and "ran on other code than today's" in plain.stderr and "Fig 2 (Sec 3)" in plain.stderr
    assert "2026-01-02, code 0123456789ab" in plain.stderr


def test_rows_measured_on_code_certified_equivalent_to_todays_stay_current(tmp_path, monkeypatch):
    """A certificate of `reproduce.py --certify` (results/certify/certificates.json) makes code whose statements
    differ count as today's: its rows are current, and the measured line says so; without it they are stale."""
    _copy(tmp_path)
    module = rules
    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", lambda row: row.update(code_version="0123456789ab"))
    measured = {fp for row in module.results_rows(str(tmp_path)) for fp in row.found} - {"0123456789ab"}
    monkeypatch.setattr(module, "TODAY", "fedcba987654")  # today's code: other statements than any row's
    assert all(row.stale for row in module.results_rows(str(tmp_path)))
    certified = dict.fromkeys([*measured, "fedcba987654", "0123456789ab"], "canonical")  # all give its numbers
    monkeypatch.setattr(module, "certified_as", lambda fp, root, job=None: certified.get(fp, fp))
    rows = module.results_rows(str(tmp_path))
    assert not any(row.stale for row in rows)
    assert module.measured_line(rows).endswith("Today's code is certified to give the same numbers, bit for bit, by "
                                               "the numerics check (`python reproduce.py --certify`, `results/certify/`).")
    del certified["0123456789ab"]  # without its certificate, the code Figure 2's runs ran on is other code
    monkeypatch.setattr(module, "certified_as", lambda fp, root, job=None: certified.get(fp, fp))
    assert [row.label for row in module.results_rows(str(tmp_path)) if row.stale] == ["Fig 2 (Sec 3)"] * 2 + [
        "Fig 2(c, d)"]


def test_the_last_quarters_fall_is_read_between_validation_points():
    module = rules
    curve = [dict(updates=u, valid_loss=loss) for u, loss in ((200, 5.0), (600, 4.0), (800, 3.5), (1000, 3.4))]
    assert abs(module.last_quarter_fall(curve) - (4.0 - 0.5 * 150 / 200 - 3.4)) < 1e-12  # 3/4 of 1000: 750
    assert abs(module.CONVERGENCE_R - 6.4641) < 1e-4


def test_a_final_quality_verdict_stands_only_where_the_training_left_cannot_change_it(tmp_path):
    """The convergence premise (results/protocols.md, 2026-11-29, 1): Figure 2's rule on curves still falling
    fast reads not testable, with each arm's fall and what the projection reads; on flat curves, the rule."""
    _copy(tmp_path)
    assert tables("--root", str(tmp_path)).returncode == 0
    verdict = _earlier(tmp_path, "Fig 2 (Sec 3)")  # its page: the premise in full
    assert verdict.startswith("**not testable** — premise: 1e-3: the training left cannot change it (fails): over "
                              "the last quarter the loss still fell by with warmup 0.249 (")
    assert "projected, the rule reads in direction from about 2x the updates; the projection has no ceiling on " \
        "BLEU and no floor on the loss" in verdict
    capped = _fig2_capped(tmp_path)  # each at a constant rate: one ended without a plateau reached the cap
    assert _cells(_row(tmp_path, "Fig 2 (Sec 3)"))[3] == (  # the README: a brief reason
        f"**not testable** — the converged runs: {_fig2_ended(tmp_path)} of 18 ended"
        + (f", {capped} at the cap without a plateau" if capped else ""))
    _settle(tmp_path, "fig2")  # flat curves: the rule reads the measured means, 0.30x at 1e-3 and 0.80x at 5e-4
    assert tables("--root", str(tmp_path)).returncode == 0
    assert _earlier(tmp_path, "Fig 2 (Sec 3)") == ("**in direction** — rule: at each rate: with warmup ≥ 20 (passes); "
                                                   "without ≤ 0.4x that; the lower word of the rates (fails); the "
                                                   "training left cannot change it (passes)")


def test_a_rule_changed_after_its_verdict_was_published_fails_the_check(tmp_path):
    """results/rules.json holds the hash of each row's rule and protocol as its verdict was published; a rule
    constant edited afterwards fails --check, naming the row, until the row is published again."""
    _copy(tmp_path)
    for name in rundir.TOP_LEVEL:  # the same code as this checkout: the rows stay current there
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    for folder in ("harness", "reproduction", "data"):
        shutil.copytree(os.path.join(ROOT, folder), tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    script, rules_file = tmp_path / "results" / "tables.py", tmp_path / "reproduction" / "tables.py"

    def check(*argv):
        return subprocess.run([sys.executable, str(script), *argv, "--root", str(tmp_path)], capture_output=True,
                              text=True)

    assert check("--check", "--allow-stale").returncode == 0  # (a row measured on other code is not this test's)
    rules_file.write_text(rules_file.read_text().replace("FIG4_AS_WELL = 1.0 ", "FIG4_AS_WELL = 1.5 "))
    failed = check("--check", "--allow-stale")
    assert failed.returncode == 1 and "as_well_row: " in failed.stderr and "(published " in failed.stderr
    assert "fig2_rows" not in failed.stderr  # the other rows' rules did not change
    before = json.loads((tmp_path / "results" / "rules.json").read_text())
    assert check("--publish", "as_well_row").returncode == 0  # re-read under the new rule, and recorded
    after = json.loads((tmp_path / "results" / "rules.json").read_text())
    assert after["as_well_row"]["hash"] != before["as_well_row"]["hash"] and after["fig2_rows"] == before["fig2_rows"]
    assert check("--check", "--allow-stale").returncode == 0


def test_the_radam_rule_gives_each_word_the_readme_defines():
    """Figure 4's RAdam rule (results/protocols.md, 2026-11-29, 8): "in direction" when RAdam lifts Post-LN above Adam
    without warmup though a check fails, as the README defines it for an effect whose sign agrees."""
    module = rules
    gap, pre = module.RADAM_POST_GAP, module.RADAM_PRE_GAP
    assert module.radam_verdict(-gap + 0.01, pre - 0.01, 5.0) == "yes"
    assert module.radam_verdict(-gap - 0.01, 0.0, 6.69) == "in direction"  # the measured case: -6.25, +6.69
    assert module.radam_verdict(0.0, pre + 0.01, 0.5) == "in direction"  # Pre-LN's check fails, the sign agrees
    assert module.radam_verdict(-gap - 0.01, 0.0, -0.5) == "NO"  # RAdam does not lift Post-LN at all
    assert module.radam_verdict(-gap - 5, pre + 3, 0.0) == "NO"


def test_the_measured_line_spans_each_codes_first_and_last_date(tmp_path):
    """A row's runs measured over several days read from the first day to the last, not the first alone."""
    _copy(tmp_path)
    dates = iter(["2026-01-02", "2027-03-04"])

    def spread(row):  # the first run of the table a day earlier than all, the second a day later
        row["measured"] = next(dates, row["measured"])

    _edit_csv(tmp_path / "results" / "depth" / "results-depth.csv", spread)
    assert tables("--root", str(tmp_path)).returncode == 0
    segments = _measured(tmp_path).removeprefix("Measured on ").split("; code ")
    assert [s for s in segments if "(2026-01-02 to 2027-03-04: " in s], segments


def test_without_mrpcs_file_figure_5a_is_still_judged(tmp_path):
    """A reproduction without GLUE MRPC (`--smoke` on a clean clone) has no fine-tuning table: the Figure
    5(b, c) row is left out, and Figure 5(a)'s is read as before."""
    _copy(tmp_path)
    (tmp_path / "results" / "fig5" / "finetune-mrpc.csv").unlink()
    assert tables("--root", str(tmp_path)).returncode == 0
    assert _row(tmp_path, "Fig 5(a)") and not [line for line in _lines(tmp_path) if line.startswith("| [Fig 5(b, c)]")]


# --- the fair-test protocols' readings (results/protocols.md) ------------------------------------------------

def _protocol(root, name, runs, table=None, fields=("final_valid_loss", "test_tokenized_bleu", "outcome")):
    """results/NAME as reproduce.py publishes a protocol: runs-NAME.csv (run, arm, lr, seed) and the results
    table; `runs` is {run: (arm, lr, seed, {field: value})}, every run on today's code."""
    folder = root / "results" / name
    _write_csv(folder / f"runs-{name}.csv", [dict(run=run, arm=arm, lr=lr, seed=seed)
                                            for run, (arm, lr, seed, _) in runs.items()], ["run", "arm", "lr", "seed"])
    today = rundir.code_version()["fingerprint"]  # hashed once a process (it reads every numeric file)
    rows = [dict(dict.fromkeys(fields, ""), run=run, code_version=today, measured="2026-01-02",
                 **values) for run, (_, _, _, values) in runs.items()]
    _write_csv(folder / (table or f"results-{name}.csv"), rows, ["run", *fields, "code_version", "measured"])
    for run in runs:  # each run's curve, flat: the convergence premise holds (a test writes its own after this)
        if table is None:
            _curve(folder / f"{run}.csv", 32, 1.0, end=1024)


def _arm(arm, rates, seeds, losses, bleu):
    """{run: ...} of an arm: seed 1 at each rate with its loss (None: diverged), then `seeds` {seed: BLEU} at the
    rate of the lowest loss; `bleu` is seed 1's BLEU at every rate."""
    runs = {}
    for lr, loss in zip(rates, losses):
        runs[f"{arm}-lr{lr}"] = (arm, lr, 1, dict(final_valid_loss="nan" if loss is None else loss,
                                                    outcome="diverged" if loss is None else "finished",
                                                    test_tokenized_bleu=bleu))
    best = min((loss, float(lr), lr) for lr, loss in zip(rates, losses) if loss is not None)[2]
    runs[f"{arm}-lr{best}"][3]["test_tokenized_bleu"] = seeds[1]
    runs.update({f"{arm}-lr{best}-seed{seed}": (arm, best, seed, dict(final_valid_loss=3.0, outcome="finished",
                                                                      test_tokenized_bleu=value))
                 for seed, value in seeds.items() if seed > 1})
    return runs


def _curve(path, reach, target, every=32, end=768):
    """A metrics CSV whose validation BLEU first reaches `target` at update `reach` (its validation loss flat: the
    convergence premise holds)."""
    rows = [dict(epoch=1 + u // 256, updates=u, valid_bleu=target if u >= reach else target / 2, valid_loss=3.0)
            for u in range(every, end + 1, every)]
    _write_csv(path, rows, ["epoch", "updates", "valid_bleu", "valid_loss"])


def test_fig4_under_its_protocol_one_number_for_sec_4_and_means_of_three_seeds(tmp_path):
    _copy(tmp_path)
    _clear(tmp_path / "results" / "fig4-converged")  # no converged run ended yet
    rates = ("5e-4", "1e-3", "2e-3")
    runs = {**_arm("post-adam-warmup", rates, {1: 23.0, 2: 24.0, 3: 25.0}, [3.5, None, 3.2], 20.0),
            **_arm("post-adam-nowarmup", rates, {1: 10.0, 2: 10.0, 3: 10.0}, [4.0, 4.1, 4.2], 8.0),
            **_arm("post-radam", rates, {1: 22.0, 2: 23.0, 3: 24.0}, [3.6, 3.4, 3.5], 20.0),
            **_arm("pre-adam-nowarmup", rates, {1: 26.0, 2: 27.0, 3: 28.0}, [3.3, 3.3, 3.4], 20.0),
            **_arm("pre-radam", rates, {1: 25.0, 2: 26.0, 3: 27.0}, [3.3, 3.2, 3.1], 20.0)}
    _protocol(tmp_path, "fig4", runs)
    main = tmp_path / "results" / "main" / "results.json"  # the main command, as if measured on today's code too
    main.write_text(json.dumps(dict(json.loads(main.read_text()), code_version=dict(
        fingerprint=rundir.code_version()["fingerprint"], measured="2026-01-02"))))
    for seed, reach in ((1, 448), (2, 480), (3, 512)):
        suffix = "" if seed == 1 else f"-seed{seed}"
        _curve(tmp_path / "results" / "fig4" / f"post-adam-warmup-lr2e-3{suffix}.csv", 768, 22.0)
        _curve(tmp_path / "results" / "fig4" / f"pre-adam-nowarmup-lr5e-4{suffix}.csv", reach, 22.0)
    assert tables("--root", str(tmp_path)).returncode == 0
    same = _cells(_row(tmp_path, "Sec 4, Fig 4"))  # the chosen rates: 2e-3 (1e-3 diverged) and 5e-4 (a tie)
    assert same[2].startswith("mean of 3 seeds, each at its best rate: Pre-LN without warmup 27.00 (26.00-28.00), "
                              "Post-LN with warmup 24.00 (23.00-25.00): +3.00; the main command ")
    assert same[3] == "**not testable** — the converged runs: 0 of 15 ended"  # its folder cleared (above)
    assert _earlier(tmp_path, "Sec 4, Fig 4").startswith("**yes** — rule: mean ≥ Post-LN with warmup's − 1 (passes)")
    faster = [line for line in _lines(tmp_path) if "... and faster" in line][0]
    # by greedy BLEU 448, 480 and 512 of 768 updates (mean 0.62x); by loss (flat curves) from the first validation
    assert "validation every 32 updates, 3 seeds: Pre-LN reaches Post-LN's final greedy BLEU in 0.62x its updates, " \
           "its final loss in 0.04x" in faster
    assert _earlier(tmp_path, "Fig 4 (Sec 4)").startswith("**yes** — rule: by BLEU, mean within 0.7x the updates (passes)")
    radam = _cells(_row(tmp_path, "Fig 4"))
    assert radam[2] == ("means at best rates: Post-LN + RAdam 23.00, -1.00 against Adam with warmup, +13.00 against "
                        "Adam without; Pre-LN + RAdam 26.00, -1.00 against Adam")
    assert _earlier(tmp_path, "Fig 4").startswith("**yes**")
    page = (tmp_path / "results" / "fig4" / "README.md").read_text()
    assert ("| post-adam-warmup | 3.500 / 20.00 | diverged / 0.00 | **3.200 / 23.00** | 3.200 / 23.00; 3.000 / "
            "24.00; 3.000 / 25.00 (mean BLEU 24.00) |") in page
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 0


def test_figure_4s_rows_read_its_longer_runs_once_they_are_published(tmp_path):
    """results/protocols.md, 2026-11-29, 2: fig4-long's runs (each arm at Figure 4's chosen rate, twice the
    updates) replace Figure 4's seeds in its rows, the grids staying Figure 4's; before, its own."""
    _copy(tmp_path)
    chosen = [row for row in read_csv(str(tmp_path / "results" / "fig4" / "runs-fig4.csv")) if int(row["seed"]) > 1]
    runs = {f"{row['arm']}-lr{experiments.rate(float(row['lr']))}{suffix}": row["arm"] for row in chosen
            for suffix in ("", f"-seed{row['seed']}")}
    bleu = {"post-adam-warmup": 30.0, "pre-adam-nowarmup": 30.5, "post-adam-nowarmup": 20.0, "post-radam": 29.5,
            "pre-radam": 30.0}
    (tmp_path / "results" / "fig4-long").mkdir(exist_ok=True)  # results/ may hold its ended runs already
    _protocol(tmp_path, "fig4-long", {run: (arm, "0", 1, dict(final_valid_loss=3.0 + (31 - bleu[arm]) / 10,
                                                              outcome="finished", test_tokenized_bleu=bleu[arm]))
                                      for run, arm in runs.items()})
    os.remove(tmp_path / "results" / "fig4-long" / "runs-fig4-long.csv")  # it publishes no protocol listing
    for run in runs:
        _curve(tmp_path / "results" / "fig4-long" / f"{run}.csv", 32 * 20, 20.0, end=1536)
    assert tables("--root", str(tmp_path)).returncode == 0
    assert "Pre-LN without warmup 30.50 (30.50-30.50), Post-LN with warmup 30.00 (30.00-30.00): +0.50" in \
        _cells(_row(tmp_path, "Sec 4, Fig 4"))[2]
    assert _earlier(tmp_path, "Sec 4, Fig 4").startswith("**yes**")  # flat curves: the premise holds
    assert _earlier(tmp_path, "Fig 4").startswith("**yes**")  # RAdam: -0.50 against Adam with warmup


def test_a_failed_premise_reads_not_testable_with_the_grid(tmp_path):
    _copy(tmp_path)
    sgd = {f"post-sgd-warmup-lr{lr}": ("post-sgd-warmup", lr, 1, dict(final_valid_loss=6.0, outcome="finished",
                                                                       test_tokenized_bleu=b))
           for lr, b in (("1e-2", 0.1), ("3e-2", 0.5), ("1e-1", 3.0), ("3e-1", 9.9))}
    adam = {**_arm("post-warmup", ("1e-3",), {1: 28.0, 2: 29.0, 3: 30.0}, [3.0], 0),
            **_arm("post-warmup38", ("1e-3",), {1: 27.0, 2: 27.5, 3: 28.0}, [3.0], 0),
            **_arm("post-nowarmup", ("1e-3",), {1: 8.0}, [5.0], 0), **_arm("pre-nowarmup", ("1e-3",), {1: 33.0}, [3.0], 0)}
    # the paper's other rate: without warmup 0.5x (only the direction), the short warmup 0.95x again
    adam.update({**_arm("post-warmup", ("5e-4",), {1: 25.0, 2: 26.0, 3: 27.0}, [3.1], 0),
                 **_arm("post-warmup38", ("5e-4",), {1: 24.0, 2: 24.5, 3: 25.0}, [3.1], 0),
                 **_arm("post-nowarmup", ("5e-4",), {1: 13.0, 2: 13.0, 3: 13.0}, [4.0], 0),
                 **_arm("pre-nowarmup", ("5e-4",), {1: 30.0, 2: 30.0, 3: 30.0}, [3.0], 0)})
    _protocol(tmp_path, "fig2", {**adam, **sgd})
    _curve(tmp_path / "results" / "fig2" / "post-warmup-lr1e-3.csv", 256, 20.0)  # the page's table reads the curves
    for run in {**adam, **sgd}:
        _curve(tmp_path / "results" / "fig2" / f"{run}.csv", 256, 20.0)
    depth = _arm("post-6L", ("2.5e-4", "5e-4", "1e-3"), {1: 12.0}, [3.4, 3.3, 3.5], 10.0)
    _protocol(tmp_path, "depth", depth)
    assert tables("--root", str(tmp_path)).returncode == 0
    assert _cells(_row(tmp_path, "Fig 2(c, d)"))[2:] == [
        "SGD with warmup 300, test BLEU at lr 1e-2 / 3e-2 / 1e-1 / 3e-1: 0.10 / 0.50 / 3.00 / 9.90",
        "**not testable** — premise: SGD with warmup reaches 10 BLEU at some rate (fails)"]
    lines = [line for line in _lines(tmp_path) if line.startswith("| [Fig 2 (Sec 3)](")]
    # each rate on the means of its seeds; the row reads the lower word of the two (2026-11-29, 5)
    assert "Post-LN with / without warmup: 1e-3: 29.00 / 8.00 (0.28x), Pre-LN 33.00; 5e-4: 26.00 / 13.00 (0.50x)" \
        in lines[0]  # yes at 1e-3, in direction at 5e-4
    assert _earlier(tmp_path, "Fig 2 (Sec 3)").startswith("**in direction** — rule: at each rate: with warmup ≥ 20 "
                                                         "(passes); without ≤ 0.4x that; the lower word of the rates "
                                                         "(fails)")
    assert "1e-3: 27.50 / 29.00 (0.95x); 5e-4: 24.50 / 26.00 (0.94x)" in lines[1]
    assert "**in direction**" in lines[1]  # 1.5 below the full warmup at each rate: only the direction
    assert _cells(_row(tmp_path, "DeepNet (Fig 1, Table 1)"))[2:] == [
        "premise: 6-layer Post-LN, test BLEU at lr 2.5e-4 / 5e-4 / 1e-3: 10.00 / 12.00 / 10.00",
        "**not testable** — premise: 6-layer Post-LN reaches 15 (fails)"]
    counts, _ = _tally(tmp_path)
    assert counts["not testable"] >= 3


def test_depth_under_its_protocol_judges_means_of_three_seeds_with_torchscales_beta_beside(tmp_path):
    _copy(tmp_path)
    rates = ("2.5e-4", "5e-4", "1e-3")
    runs = {**_arm("post-6L", rates, {1: 22.0, 2: 23.0, 3: 24.0}, [3.6, 3.4, 3.5], 15.0),
            **_arm("pre-6L", rates, {1: 25.0, 2: 26.0, 3: 27.0}, [3.5, 3.4, 3.3], 20.0),
            **_arm("deepnorm-6L", rates, {1: 25.0, 2: 25.0, 3: 25.0}, [3.5, 3.3, 3.4], 20.0),
            **_arm("post-12L", rates, {1: 10.0, 2: 12.0, 3: 14.0}, [4.0, None, 4.5], 5.0),
            **_arm("pre-12L", rates, {1: 26.0, 2: 27.0, 3: 28.0}, [3.3, 3.2, 3.4], 20.0),
            **_arm("deepnorm-12L", rates, {1: 27.0, 2: 27.0, 3: 27.0}, [3.3, 3.1, 3.2], 20.0),
            **_arm("deepnorm-torchscale-6L", ("5e-4",), {1: 24.0, 2: 24.5, 3: 25.0}, [3.3], 0),
            **_arm("deepnorm-torchscale-12L", ("5e-4",), {1: 26.0, 2: 26.0, 3: 26.0}, [3.2], 0)}
    _protocol(tmp_path, "depth", runs)
    assert tables("--root", str(tmp_path)).returncode == 0
    here, verdict = _cells(_row(tmp_path, "DeepNet (Fig 1, Table 1)"))[2], _verdict(tmp_path, "DeepNet (Fig 1, Table 1)")
    assert here == ("mean of 3 seeds at best rates, 6 / 12 layers: Post-LN 23.00 / 12.00, Pre-LN 26.00 / 27.00, "
                    "DeepNorm 25.00 / 27.00; torchscale's β 24.50 / 26.00")
    assert verdict == ("**yes** — rule: Post-LN at 12 layers diverged or ≥ 5 below 6 layers (passes); "
                       "Pre-LN, DeepNorm ≥ 15 everywhere (passes); DeepNorm ≥ Pre-LN − 0.5 at 12+ layers (passes); "
                       "2 seeds (passes); the training left cannot change it (passes)")  # the rule's constant, committed before the protocol's 3 seeds
    page = (tmp_path / "results" / "depth" / "README.md").read_text()
    assert "| post-12L | **4.000 / 10.00** | diverged / 0.00 | 4.500 / 5.00 | 4.000 / 10.00; 3.000 / 12.00; " \
           "3.000 / 14.00 (mean BLEU 12.00) |" in page  # the grid replaces the earlier runs' table
    assert "| 6 | Post-LN | 10.30 / 8.98 |" not in page
    runs["deepnorm-12L-lr5e-4-seed3"][3]["test_tokenized_bleu"] = 25.0  # DeepNorm 26.33 at 12 layers, 0.67 below
    _protocol(tmp_path, "depth", runs)
    assert tables("--root", str(tmp_path)).returncode == 0
    verdict = _verdict(tmp_path, "DeepNet (Fig 1, Table 1)")
    assert verdict.startswith("**NO** — rule:") and "DeepNorm ≥ Pre-LN − 0.5 at 12+ layers (fails)" in verdict
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 0
    _protocol(tmp_path, "depth", {run: value for run, value in runs.items() if value[2] == 1})
    assert tables("--root", str(tmp_path)).returncode == 0  # seed 1 alone: the rule asks for the mean of two
    here, verdict = _cells(_row(tmp_path, "DeepNet (Fig 1, Table 1)"))[2], _verdict(tmp_path, "DeepNet (Fig 1, Table 1)")
    assert here.startswith("mean of 1 seed at best rates, 6 / 12 layers: Post-LN 22.00 / 10.00, ")
    assert verdict.startswith("**in direction** — rule:") and verdict.endswith("; 2 seeds: 1 (fails); the training left cannot change it (passes)")


def test_sgds_rate_is_chosen_among_the_rates_that_pass_its_premise(tmp_path):
    """Figure 2(c, d): 3e-1 has the lowest loss but stays under 10 BLEU, so 1e-1 (12 BLEU) is chosen, and the
    runs without warmup at 1e-1 and 2e-1 judge it; the page's grid bolds 1e-1."""
    _copy(tmp_path)

    def run(arm, lr, seed, loss, bleu):
        name = f"{arm}-lr{lr}" + (f"-seed{seed}" if seed > 1 else "")
        return {name: (arm, lr, seed, dict(final_valid_loss=loss, outcome="finished", test_tokenized_bleu=bleu))}
    runs = {**_arm("post-warmup", ("1e-3",), {1: 28.0, 2: 29.0, 3: 30.0}, [3.0], 0),
            **_arm("post-warmup38", ("1e-3",), {1: 10.0, 2: 11.0, 3: 12.0}, [3.0], 0),
            **_arm("post-nowarmup", ("1e-3",), {1: 8.0}, [5.0], 0), **_arm("pre-nowarmup", ("1e-3",), {1: 33.0}, [3.0], 0)}
    for lr, loss, bleu in (("1e-2", 6.0, 2.0), ("3e-2", 5.5, 4.0), ("1e-1", 5.0, 12.0), ("3e-1", 4.9, 9.0)):
        runs.update(run("post-sgd-warmup", lr, 1, loss, bleu))
    for seed, warm, cold in ((1, None, 3.0), (2, 11.0, 4.0), (3, 13.0, 5.0)):
        runs.update({**(run("post-sgd-warmup", "1e-1", seed, 5.0, warm) if warm else {}),
                     **run("post-sgd-nowarmup", "1e-1", seed, 5.5, cold)})
    runs.update(run("post-sgd-nowarmup", "2e-1", 1, 5.4, 1.0))  # its loss lower than at 1e-1: not its rate
    _protocol(tmp_path, "fig2", runs)
    for name in runs:
        _curve(tmp_path / "results" / "fig2" / f"{name}.csv", 256, 20.0)
    assert tables("--root", str(tmp_path)).returncode == 0
    assert _cells(_row(tmp_path, "Fig 2(c, d)"))[2:] == [
        "SGD at lr 1e-1 (best of 4): with warmup 12.00 (3 seeds), without 4.00 (3 seeds); without at 2e-1: 1.00",
        "**yes** — rule: with warmup ≥ 10; without ≤ 0.4x that"]
    page = (tmp_path / "results" / "fig2" / "README.md").read_text()
    assert ("| post-sgd-warmup | - | 6.000 / 2.00 | 5.500 / 4.00 | **5.000 / 12.00** | - | 4.900 / 9.00 | 5.000 / 12.00; "
            "5.000 / 11.00; 5.000 / 13.00 (mean BLEU 12.00) |") in page
    assert "| post-sgd-nowarmup | - | - | - | **5.500 / 3.00** | 5.400 / 1.00 | - | 5.500 / 3.00; 5.500 / 4.00; " in page


def test_fig5_under_its_protocol_needs_a_target_below_the_unigram_entropy(tmp_path):
    _copy(tmp_path)
    _clear(tmp_path / "results" / "fig5-converged")  # the row's earlier reading, while no converged run has ended
    runs = {}
    for recipe, losses in (("post-warmup", [6.9, 6.8, 7.2, 8.0]), ("pre-no-warmup", [6.7, 6.5, 6.6, 9.0])):
        for lr, loss in zip(("1e-4", "3e-4", "1e-3", "3e-3"), losses):
            runs[f"{recipe}-lr{lr}"] = (recipe, lr, 1, dict(final_valid_loss=loss, outcome="finished",
                                                            final_valid_accuracy=0.2))
    fields = ("final_valid_loss", "final_valid_accuracy", "outcome")
    _protocol(tmp_path, "fig5", runs, table="results.csv", fields=fields)
    curves = [dict(run=run, updates=u, lr=1e-4, valid_loss=values["final_valid_loss"] + (1000 - u) / 1000,
                   valid_accuracy=0.2) for run, (_, _, _, values) in runs.items() for u in range(100, 1001, 100)]
    _write_csv(tmp_path / "results" / "fig5" / "curves.csv", curves, ["run", "updates", "lr", "valid_loss",
                                                                      "valid_accuracy"])
    speedup = json.loads((tmp_path / "results" / "fig5" / "speedup.json").read_text())
    (tmp_path / "results" / "fig5" / "speedup.json").write_text(json.dumps(dict(speedup, unigram_entropy=8.0)))
    assert tables("--root", str(tmp_path)).returncode == 0
    here, verdict = _cells(_row(tmp_path, "Fig 5(a)"))[2], _earlier(tmp_path, "Fig 5(a)")
    # Post-LN's best is 3e-4 (6.8 at update 1000: 1.2 nat below the entropy); at updates 250, 500 and 750 it is at
    # 7.55, 7.3 and 7.05, which Pre-LN's (3e-4: 6.5 at 1000) reaches at its validations 100, 200 and 500
    assert here == ("best rates (3e-4 each): Post-LN ends 1.20 nat below the unigram entropy, masked-LM accuracy "
                    "20.0 %; Pre-LN reaches its losses of updates 250-750 2.17x sooner, its final one 1.4x sooner")
    assert verdict == ("**yes** — rule: ≥ 1.4x sooner at Post-LN's losses of updates 250, 500, 750 (passes); the "
                       "target ≥ 1 nat below the unigram entropy (passes)")
    # Pre-LN's curves 0.43 higher: at Post-LN's levels from update 400, 700 and 900 on (0.72x), its final one never
    slow = [dict(row, valid_loss=row["valid_loss"] + 0.43) if row["run"].startswith("pre-") else row for row in curves]
    _write_csv(tmp_path / "results" / "fig5" / "curves.csv", slow, ["run", "updates", "lr", "valid_loss",
                                                                    "valid_accuracy"])
    assert tables("--root", str(tmp_path)).returncode == 0
    here, verdict = _cells(_row(tmp_path, "Fig 5(a)"))[2], _earlier(tmp_path, "Fig 5(a)")
    assert here.endswith("Pre-LN reaches its losses of updates 250-750 0.72x sooner, its final one never")
    assert verdict.startswith("**NO** — rule: ≥ 1.4x sooner at Post-LN's losses of updates 250, 500, 750 (fails)")
    # a target only 0.7 nat below the unigram entropy: the model has barely left unigram counts
    (tmp_path / "results" / "fig5" / "speedup.json").write_text(json.dumps(dict(speedup, unigram_entropy=7.5)))
    assert tables("--root", str(tmp_path)).returncode == 0
    assert _earlier(tmp_path, "Fig 5(a)") == "**not testable** — premise: the target ≥ 1 nat below the unigram entropy (fails)"


def test_figure_5a_is_judged_at_the_plateau_on_post_lns_margin_then_the_levels_both_reach(tmp_path):
    """results/protocols.md, 2026-12-02: once the 6 runs of `fig5-converged` have ended, Figure 5(a) needs Post-LN's
    final loss, the mean of its 3 seeds, at least 1 nat under the unigram entropy, then reads Post-LN's updates over
    Pre-LN's at the levels both reach; the earlier reading stays on the page, superseded."""
    _copy(tmp_path)
    _converged(tmp_path, "fig5-converged", {"post-warmup": 30.0, "pre-no-warmup": 30.0}, faster=1.6)  # final loss 4.0
    folder = tmp_path / "results" / "fig5-converged"

    def row(entropy):
        for path in folder.glob("*.json"):
            path.write_text(json.dumps(dict(json.loads(path.read_text()), unigram_entropy=entropy)))
        assert tables("--root", str(tmp_path)).returncode == 0
        return _cells(_row(tmp_path, "Fig 5(a)"))
    here, verdict = row(5.5)[2:]
    assert here == ("at the plateau, 3 seeds: Post-LN ends 1.50 nat below the unigram entropy; Pre-LN reaches the "
                    "levels both reach 1.60x sooner")
    assert verdict == "**yes** — its rule and checks on its page"
    assert _verdict(tmp_path, "Fig 5(a)").startswith(
        "**yes** — rule: ≥ 1.4x sooner at the levels both reach (passes); the target ≥ 1 nat below the unigram entropy "
        "(passes); superseded (results/protocols.md, 2026-12-02), the earlier reading on curves still falling (measured ")
    here, verdict = row(4.5)[2:]  # 0.5 nat: the model has barely left unigram counts
    assert here.startswith("at the plateau, 3 seeds: Post-LN ends 0.50 nat below the unigram entropy;")
    assert verdict == "**not testable** — premise: the target ≥ 1 nat below the unigram entropy (fails)"


def test_the_main_commands_time_is_quoted_from_its_results_alone(tmp_path):
    """The Quick start and docs/translation.md quote one set of timings, written from results/main/: a new
    measurement rewrites both; before any, they say how to measure it."""
    _copy(tmp_path)
    main = tmp_path / "results" / "main"
    result = json.loads((main / "results.json").read_text())
    (main / "results.json").write_text(json.dumps(dict(result, train_minutes=2.5, test_bleu=30.0, compile_s=12.0)))
    (main / "timing.json").write_text(json.dumps({"main": dict(wall_s=180.0, jobs=2, cpu="Test CPU")}))
    assert tables("--root", str(tmp_path)).returncode == 0
    for page in ("README.md", "docs/translation.md"):
        text = (tmp_path / page).read_text()
        assert ("3.0 min in all, 2.5 of them training on a 2-core Test CPU (jax, 12 s compiling 40 programs; "
                "`reproduce.py --only main`") in text and "test BLEU 30.00 (sacrebleu" in text, page
    module = rules
    shutil.rmtree(main)
    assert module.main_run(str(tmp_path)) == "not measured yet: `python reproduce.py --only main`."


def test_shared_levels_read_the_updates_each_curve_needs_at_levels_both_reach():
    """results/protocols.md, 2026-12-02, 5: at Post-LN's values at 1/4-1 of its updates to L* (the worse of the
    two best values), the updates the other curve needs over Post-LN's, interpolated between validations."""
    t = rules
    post = [(u, 6.0 - u / 1000) for u in range(128, 4097, 128)]  # falls 1 nat each 1,000 updates to 1.904
    pre = [(u, 6.0 - u / 500) for u in range(128, 2049, 128)]  # twice as fast, to 1.904 at 2,048
    assert t.first_at(post, 5.0) == 1000.0 and t.first_at(post, 0.0) is None
    assert [round(r, 3) for r in t.shared_levels(post, pre)] == [0.5, 0.5, 0.5, 0.5]
    bleu = [(u, v * 10) for u, v in pre]  # higher is better
    assert t.first_at(bleu, 30.0, better=+1) == 128.0
    assert t.smoothing_floor(0.1, 4000) == pytest.approx(1.154, abs=5e-4)


def _converged(root, name, bleu, plateau=3328, faster=1.0, at_cap=()):
    """Every run of the converged experiment `name` ended on today's code: test BLEU `bleu[arm]`, stopped at
    `plateau` (None: the cap; the arms `at_cap` at the cap whatever it is), validation curves every 128
    updates, Pre-LN's `faster` times Post-LN's speed."""
    folder = root / "results" / name
    folder.mkdir(parents=True, exist_ok=True)
    _clear(folder)
    runs = experiments.EXPERIMENTS[name].runs
    _write_csv(folder / f"runs-{name}.csv", [dict(run=r.name, arm=r.recipe, lr=r.spec.lr, seed=r.spec.seed)
                                             for r in runs], ["run", "arm", "lr", "seed"])
    today = dict(fingerprint=rundir.fingerprint(), measured="2026-12-02")
    for r in runs:
        speed = faster if r.recipe.startswith("pre-") else 1.0
        stop = None if r.recipe in at_cap else plateau
        end = stop or 6144
        (folder / f"{r.name}.json").write_text(json.dumps(dict(
            outcome="finished", updates=end, plateau_at=stop, final_valid_loss=3.0 + (40 - bleu[r.recipe]) / 10,
            test_tokenized_bleu=bleu[r.recipe], code_version=today)))
        curve = [dict(updates=u, valid_loss=3.0 + 3.0 * math.exp(-speed * u / 1000),
                      valid_bleu=40.0 - 30.0 * math.exp(-speed * u / 1000)) for u in range(128, end + 1, 128)]
        _write_csv(folder / f"{r.name}.csv", curve, ["updates", "valid_loss", "valid_bleu"])


def test_figure_4_is_judged_at_the_plateau_once_every_converged_run_has_ended(tmp_path):
    """results/protocols.md, 2026-12-02 and 2026-12-06: Figure 4's rows read `fig4-converged` once its 15 runs
    have ended at their plateaus, or a linear decay's at its end (the cap, its rate 0); a run at the cap with
    its rate above 0 (inverse sqrt, step), or one not ended, keeps them not testable, the earlier reading beside."""
    _copy(tmp_path)
    bleu = {"post-adam-warmup": 35.0, "pre-adam-nowarmup": 34.5, "post-adam-nowarmup": 20.0, "post-radam": 34.0,
            "pre-radam": 35.0}
    _converged(tmp_path, "fig4-converged", bleu, faster=1.6)
    assert tables("--root", str(tmp_path)).returncode == 0
    row = _cells(_row(tmp_path, "Sec 4, Fig 4"))
    assert row[2].startswith("at the plateau, mean of 3 seeds: Pre-LN without warmup 34.50 (34.50-34.50), Post-LN "
                             "with warmup 35.00 (35.00-35.00): -0.50 (stops: Pre-LN Adam 3,328 / 3,328 / 3,328;")
    assert row[3].startswith("**yes** — rule: mean ≥ Post-LN with warmup's − 1, each arm at its plateau")
    faster = _cells(_row(tmp_path, "Fig 4 (Sec 4)"))  # 1 / 1.6 = 0.625 of the updates at every level, 0.63 as interpolated
    assert faster[2] == ("at the levels both reach, 3 seeds: Pre-LN needs 0.63x Post-LN's updates by validation loss, "
                         "0.63x by greedy BLEU") and faster[3].startswith("**yes**")
    assert _cells(_row(tmp_path, "Fig 4"))[3].startswith("**yes**")  # RAdam: -1.00 and +0.50
    # The earlier reading stays on the page, after the row's own and superseded; the README's table has the row's.
    superseded = "superseded (results/protocols.md, 2026-12-02), the earlier reading on curves still falling (measured "
    for label in ("Sec 4, Fig 4", "Fig 4 (Sec 4)", "Fig 4"):
        assert superseded in _verdict(tmp_path, label) and "superseded" not in _row(tmp_path, label)
    page = (tmp_path / "results" / "fig4" / "README.md").read_text()
    assert "`python reproduce.py --only fig4-converged`: 15 of 15 runs ended." in page
    assert "| post-adam-warmup | 4e-3 | 2 | plateau at 3,328 | 3.500 / 35.00 |" in page
    linear = ("post-adam-nowarmup", "post-radam", "pre-radam")  # each decays to 0 at the cap
    _converged(tmp_path, "fig4-converged", bleu, faster=1.6, at_cap=linear)
    assert tables("--root", str(tmp_path)).returncode == 0
    assert _cells(_row(tmp_path, "Fig 4"))[3].startswith("**yes**")  # the linear decays ended their schedules
    page = (tmp_path / "results" / "fig4" / "README.md").read_text()
    assert "| pre-radam | 8e-3 | 3 | decayed to 0 at 6,144 |" in page and "15 of 15 runs ended." in page
    _converged(tmp_path, "fig4-converged", bleu, plateau=None)  # every run at the cap
    assert tables("--root", str(tmp_path)).returncode == 0
    assert _cells(_row(tmp_path, "Sec 4, Fig 4"))[3].endswith("**not testable** — 6 of 15 runs reached the cap "
                                                              "without a plateau")
    page = (tmp_path / "results" / "fig4" / "README.md").read_text()
    assert "| pre-adam-nowarmup | 4e-3 | 3 | cap (6,144) |" in page and "| pre-radam | 8e-3 | 3 | decayed to 0 at 6,144 |" in page
    assert "15 of 15 runs ended, 6 at the cap without a plateau" in page
    _converged(tmp_path, "fig4-converged", bleu)
    os.remove(tmp_path / "results" / "fig4-converged" / f"{experiments.EXPERIMENTS['fig4-converged'].runs[-1].name}.json")
    assert tables("--root", str(tmp_path)).returncode == 0
    assert _cells(_row(tmp_path, "Fig 4"))[3].endswith("**not testable** — the converged runs: 14 of 15 ended")
    _converged(tmp_path, "fig4-converged", bleu, at_cap=("pre-adam-nowarmup",))  # one arm at the cap, a run left
    os.remove(tmp_path / "results" / "fig4-converged" / f"{experiments.EXPERIMENTS['fig4-converged'].runs[-1].name}.json")
    assert tables("--root", str(tmp_path)).returncode == 0
    assert _cells(_row(tmp_path, "Fig 4"))[3].endswith("**not testable** — the converged runs: 14 of 15 ended, 3 at "
                                                       "the cap without a plateau")
    assert ("14 of 15 runs of `fig4-converged` ended (`python reproduce.py --only fig4-converged`), 3 of them at the "
            "cap without a plateau (pre-adam-nowarmup-lr4e-3, ") in _verdict(tmp_path, "Fig 4")
    assert "superseded (results/protocols.md, 2026-12-02), the earlier reading on curves still falling: " \
        in _verdict(tmp_path, "Fig 4")


def test_figure_2_is_judged_at_the_plateau_at_both_rates(tmp_path):
    _copy(tmp_path)
    _converged(tmp_path, "fig2-converged", {"post-warmup": 30.0, "post-nowarmup": 9.0, "pre-nowarmup": 33.0})
    assert tables("--root", str(tmp_path)).returncode == 0
    row = _cells(_row(tmp_path, "Fig 2 (Sec 3)"))
    assert row[2] == ("at the plateau, Adam, 3 seeds, Post-LN with / without warmup: 1e-3: 30.00 / 9.00 (0.30x), "
                      "Pre-LN 33.00; 5e-4: 30.00 / 9.00 (0.30x), Pre-LN 33.00")
    assert row[3].startswith("**yes**")
