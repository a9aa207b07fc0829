"""The README's Results table and the results pages, written from the files in results/ (the rules, and how
each row reads its runs: reproduction/tables.py).

    python results/tables.py                  # rewrite the generated tables in README.md and results/*/README.md
    python results/tables.py --check          # exit 1 if a table differs from the files, or a row is stale
    python results/tables.py --check --allow-stale   # the same, but stale rows (marked so) pass
    python results/tables.py --publish fig2_rows      # re-read rows under their changed rule (results/rules.json)
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository, whose packages these are

from reproduction.tables import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
