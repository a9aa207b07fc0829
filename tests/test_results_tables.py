"""The README's Results table and the sweeps' detail tables say what the files in results/ say."""

import csv
import os
import pathlib
import re
import shutil
import subprocess
import sys

from harness import provenance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    return _cells(_row(root, label))[3]


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
    today = provenance.fingerprint()
    before, _ = _tally(tmp_path)
    were_stale = sum(_verdict(tmp_path, label).startswith("stale") for label in ("Fig 2 (Sec 3)", "Fig 2(c, d)"))
    scores = {"post-warmup-lr1e-3": "25.0", "post-nowarmup-lr1e-3": "9.0"}  # 0.36x: the rule's 0.4x holds

    def change(row):
        row["test_tokenized_bleu"] = scores.get(row["run"], row["test_tokenized_bleu"])
        row["code_version"], row["measured"] = today, "2026-01-02"

    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", change)
    stale = tables("--check", "--allow-stale", "--root", str(tmp_path))
    assert stale.returncode == 1 and "README.md" in stale.stderr
    assert tables("--root", str(tmp_path)).returncode == 0
    here = _cells(_row(tmp_path, "Fig 2 (Sec 3)"))[2]
    assert "Post-LN 25.00 with warmup 300, 9.00 without (0.36x)" in here
    assert _verdict(tmp_path, "Fig 2 (Sec 3)") == ("**yes** — rule: with warmup ≥ 20 (passes); "
                                                   "without ≤ 0.4x that (passes)")
    # The "measured on" line: today's code, with the new date, and no other code for Fig 2's rows.
    segments = _measured(tmp_path).removeprefix("Measured on ").split("; code ")
    mine = [s for s in segments if f"`{today}`" in s]
    assert len(mine) == 1 and "2026-01-02" in mine[0], segments
    assert not [s for s in segments if s is not mine[0] and "Fig 2 (Sec 3)" in s], segments
    fresh, line = _tally(tmp_path)
    assert "Fig 2 (Sec 3)" not in line and fresh["stale"] == before["stale"] - were_stale
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 0

    scores["post-nowarmup-lr1e-3"] = "10.5"  # 0.42x: just outside the rule, so only the direction agrees
    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", change)
    assert tables("--root", str(tmp_path)).returncode == 0
    assert "10.50 without (0.42x)" in _cells(_row(tmp_path, "Fig 2 (Sec 3)"))[2]
    assert _verdict(tmp_path, "Fig 2 (Sec 3)").startswith("**in direction** — rule: with warmup ≥ 20 (passes); "
                                                         "without ≤ 0.4x that (fails)")
    after, _ = _tally(tmp_path)
    assert (after.get("yes", 0), after.get("in direction", 0)) == (fresh["yes"] - 1, fresh.get("in direction", 0) + 1)


def test_a_row_from_other_code_is_marked_stale_and_fails_the_plain_check(tmp_path):
    _copy(tmp_path)
    today = provenance.fingerprint()

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
    assert _verdict(tmp_path, "Fig 2 (Sec 3)").startswith("stale: would be **yes** — rule: with warmup ≥ 20")
    assert "code `0123456789ab` (2026-01-02: Fig 2 (Sec 3), Fig 2(c, d))" in _measured(tmp_path)
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 0
    plain = tables("--check", "--root", str(tmp_path))
    assert plain.returncode == 1 and "ran on other code than today's" in plain.stderr and "Fig 2 (Sec 3)" in plain.stderr
    assert "2026-01-02, code 0123456789ab" in plain.stderr


def test_the_depth_rule_judges_the_mean_of_two_seeds(tmp_path):
    _copy(tmp_path)
    path = tmp_path / "results" / "depth" / "results-depth.csv"
    pre = {(r["layers"], r["run"].endswith("seed2")): r["test_tokenized_bleu"] for r in csv.DictReader(open(path))
           if r["norm"] == "pre"}

    def deepnorm_as_pre(row):  # DeepNorm given Pre-LN's BLEU, seed by seed: the last clause of the rule holds
        if row["norm"] == "deepnorm":
            row["test_tokenized_bleu"] = pre[row["layers"], row["run"].endswith("seed2")]
        row["code_version"] = provenance.fingerprint()  # measured on today's code: the row gives its verdict

    _edit_csv(path, deepnorm_as_pre)
    assert tables("--root", str(tmp_path)).returncode == 0
    verdict = _verdict(tmp_path, "DeepNet (Fig 1, Table 1)")
    assert verdict == ("**yes** — rule: Post-LN at 12 layers diverged or ≥ 5 below 6 layers (passes); "
                       "Pre-LN, DeepNorm ≥ 15 everywhere (passes); DeepNorm ≥ Pre-LN − 0.5 at 12+ layers (passes); "
                       "2 seeds (passes)")
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 0
    rows = [r for r in csv.DictReader(open(path)) if not r["run"].endswith("seed2")]
    _write_csv(path, rows, list(rows[0]))  # one seed: the rule asks for the mean of two
    assert tables("--root", str(tmp_path)).returncode == 0
    verdict = _verdict(tmp_path, "DeepNet (Fig 1, Table 1)")
    assert not verdict.startswith("**yes**") and verdict.endswith("; 2 seeds: 1 seed (fails)")
    assert "mean of 1 seed, at 6 / 12 layers" in _cells(_row(tmp_path, "DeepNet (Fig 1, Table 1)"))[2]
    seed1 = float(pre["6", False])
    assert f"| 6 | Pre-LN | {seed1:.2f} | {seed1:.2f} |" in (tmp_path / "results" / "depth" / "README.md").read_text()
