"""The README's Results table and the sweeps' detail tables say what the files in results/ say."""

import csv
import os
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


def _fig2_row(root):
    readme = (root / "README.md").read_text()
    return next(line for line in readme.splitlines() if line.startswith("| Fig 2 (Sec 3)"))


def test_a_changed_result_makes_the_table_stale_and_the_rule_judges_it(tmp_path):
    _copy(tmp_path)
    today = provenance.fingerprint()
    scores = {"post-warmup-lr1e-3": "25.0", "post-nowarmup-lr1e-3": "9.0"}  # 0.36x: the rule's 0.4x holds

    def change(row):
        row["test_tokenized_bleu"] = scores.get(row["run"], row["test_tokenized_bleu"])
        row["code_version"], row["measured"] = today, "2026-01-02"

    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", change)
    stale = tables("--check", "--allow-stale", "--root", str(tmp_path))
    assert stale.returncode == 1 and "README.md" in stale.stderr
    assert tables("--root", str(tmp_path)).returncode == 0
    row = _fig2_row(tmp_path)
    assert "25.00 with warmup 300 against 9.00 without" in row
    assert "| yes: with warmup 25.00 (rule: at least 20), without it 0.36x that (rule: at most 0.4x) |" in row
    assert f"| 2026-01-02, code {today} |" in row
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 0

    scores["post-nowarmup-lr1e-3"] = "10.5"  # 0.42x: just outside the rule, so only the direction agrees
    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", change)
    assert tables("--root", str(tmp_path)).returncode == 0
    assert "| in direction: with warmup 25.00" in _fig2_row(tmp_path)


def test_a_row_from_other_code_is_marked_stale_and_fails_the_plain_check(tmp_path):
    _copy(tmp_path)
    today = provenance.fingerprint()

    def change(row):
        row["code_version"], row["measured"] = today, "2026-01-02"

    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", change)
    assert tables("--root", str(tmp_path)).returncode == 0
    assert "stale" not in _fig2_row(tmp_path).split("|")[3]

    def older(row):
        row["code_version"] = "0123456789ab"

    _edit_csv(tmp_path / "results" / "fig2" / "results-fig2.csv", older)
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 1  # the README does not say so yet
    assert tables("--root", str(tmp_path)).returncode == 0
    row = _fig2_row(tmp_path)
    assert "| stale (measured on other code than today's; by the rule those numbers give: yes" in row
    assert "| 2026-01-02, code 0123456789ab |" in row
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 0
    plain = tables("--check", "--root", str(tmp_path))
    assert plain.returncode == 1 and "ran on other code than today's" in plain.stderr and "Fig 2 (Sec 3)" in plain.stderr


def _depth_row(root):
    readme = (root / "README.md").read_text()
    return next(line for line in readme.splitlines() if line.startswith("| DeepNet (Fig 1, Table 1)"))


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
    row = _depth_row(tmp_path)
    assert "| yes: Post-LN at 12 layers fails" in row and "DeepNorm holds Pre-LN - 0.5 at 12+ layers; 2 seeds" in row
    assert tables("--check", "--allow-stale", "--root", str(tmp_path)).returncode == 0
    rows = [r for r in csv.DictReader(open(path)) if not r["run"].endswith("seed2")]
    _write_csv(path, rows, list(rows[0]))  # one seed: the rule asks for the mean of two
    assert tables("--root", str(tmp_path)).returncode == 0
    row = _depth_row(tmp_path)
    assert "| yes" not in row and "1 seed (the rule: mean of 2)" in row
    seed1 = float(pre["6", False])
    assert f"| 6 | Pre-LN | {seed1:.2f} | {seed1:.2f} |" in (tmp_path / "results" / "depth" / "README.md").read_text()
