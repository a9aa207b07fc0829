"""The README's Results table and the sweeps' detail tables say what the files in results/ say."""

import csv
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "results", "tables.py")


def tables(*argv):
    return subprocess.run([sys.executable, SCRIPT, *argv], capture_output=True, text=True)


def test_generated_tables_are_up_to_date():
    done = tables("--check")
    assert done.returncode == 0, done.stderr


def test_a_changed_result_makes_the_table_stale_and_rewrites_it(tmp_path):
    shutil.copytree(os.path.join(ROOT, "results"), tmp_path / "results")
    shutil.copytree(os.path.join(ROOT, "docs"), tmp_path / "docs")
    shutil.copy(os.path.join(ROOT, "README.md"), tmp_path / "README.md")
    path = tmp_path / "results" / "fig2" / "results-fig2.csv"
    rows = list(csv.DictReader(open(path)))
    rows[1]["test_bleu"] = "0.01"  # Post-LN without warmup: the gap becomes larger than 10 BLEU
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    stale = tables("--check", "--root", str(tmp_path))
    assert stale.returncode == 1 and "README.md" in stale.stderr
    assert tables("--root", str(tmp_path)).returncode == 0
    readme = (tmp_path / "README.md").read_text()
    assert "against 0.01 without" in readme
    fig2_row = next(line for line in readme.splitlines() if line.startswith("| Fig 2 (Sec 3)"))
    assert "| yes: a gap of 10.0 BLEU" in fig2_row
    assert tables("--check", "--root", str(tmp_path)).returncode == 0
