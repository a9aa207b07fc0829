"""Which code produced a result: `code_version()`, recorded in every results.json and summary file.

    code_version()  ->  {"fingerprint": "3f2a9c01d4e7", "commit": "<git HEAD or null>", "dirty": false,
                         "measured": "2026-11-25"}

The fingerprint is a hash of what can change a run's numbers: the Python source of the reproduction (the
top-level modules and harness/, less the modules that only draw, print or explain: `NOT_NUMERIC`) and the
shipped data under data/; not the package reproduction/, which places runs on machines and judges them.
Comments, docstrings, blank lines and trailing spaces are left out of the hash, so a clearer comment keeps
every result current while any change to a statement makes them stale. The Results table
(reproduction/tables.py) compares each quoted run's fingerprint with today's and marks a row stale when they
differ. `commit` is the git commit the working tree stood on (informational: the fingerprint decides), and
`dirty` says whether a fingerprinted file differed from that commit. `measured` is the day the run started.

Code that differs in its statements may still give the same numbers: `python reproduce.py --certify`
(reproduction/certify.py) proves it for today's code, bit for bit, and writes the certificate into
results/certify/certificates.json; reproduction/tables.py then counts rows measured on equivalent code as
current.

Without Keras: the tables (reproduction/tables.py) import this module too.
"""

import ast
import datetime
import functools
import hashlib
import io
import os
import subprocess
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Modules of harness/ whose changes cannot move a number: figures, progress lines, messages, the package's
# map. The package reproduction/ (the experiments, their runs and processes, the tables and the numerics check)
# is outside the fingerprint altogether: no training run imports it (tests/test_module_graph.py), a run's
# settings are its spec, which its run directory records, and reproduce.py runs again any run whose spec an
# edit of the experiments changed.
NOT_NUMERIC = {"harness/__init__.py", "harness/plots.py", "harness/console.py"}
TOP_LEVEL = ("layers.py", "models.py", "schedules.py", "optimizers.py", "train_nmt.py", "pretrain_bert.py",
             "analyze_grads.py")


def numeric_files(root=ROOT, top_level=TOP_LEVEL, not_numeric=NOT_NUMERIC):
    """The files the fingerprint covers, relative to `root`, sorted (by these rules, or by another version's
    `top_level` and `not_numeric`: reproduction/certify.py reads a measured commit's)."""
    files = [name for name in top_level if os.path.exists(os.path.join(root, name))]
    files += [f"harness/{name}" for name in os.listdir(os.path.join(root, "harness")) if name.endswith(".py")]
    for folder, _, names in os.walk(os.path.join(root, "data")):
        files += [os.path.relpath(os.path.join(folder, name), root) for name in names if not name.endswith(".md")]
    return sorted(f.replace(os.sep, "/") for f in files if f.replace(os.sep, "/") not in not_numeric)


def statements_only(source):
    """Python source less its comments, docstrings, blank lines and trailing spaces."""
    return "\n".join(line for line in code_lines(source) if line)


def code_lines(source):
    """The lines of Python source as the fingerprint reads them, one for each line of `source`: without
    its comment and trailing spaces, and blank ("") for a line of a docstring."""
    tree = ast.parse(source)
    skip = set()
    for node in [tree, *ast.walk(tree)]:
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            skip.update(range(body[0].lineno, body[0].end_lineno + 1))
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:  # a comment runs to the end of its line
            row, col = token.start
            lines[row - 1] = lines[row - 1][:col]
    return ["" if number in skip else line.rstrip() for number, line in enumerate(lines, 1)]


def fingerprint(root=ROOT):
    """12 hex digits of SHA-256 over `numeric_files`: each file's name, then its statements (or bytes)."""
    digest = hashlib.sha256()
    for name in numeric_files(root):
        with open(os.path.join(root, name), "rb") as f:
            data = f.read()
        if name.endswith(".py"):
            data = statements_only(data.decode("utf-8")).encode("utf-8")
        digest.update(name.encode("utf-8") + b"\0" + data + b"\0")
    return digest.hexdigest()[:12]


def _git(*argv, root=ROOT):
    try:
        done = subprocess.run(["git", "-C", root, *argv], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def code_version(root=ROOT):
    """{"fingerprint", "commit", "dirty", "measured"} of the code this process runs: taken at the first call,
    which the scripts make as they start (`cli.run_script`), so that a file edited while a run trains does
    not change what the run records."""
    commit = _git("rev-parse", "HEAD", root=root)
    changed = _git("status", "--porcelain", "--", *numeric_files(root), root=root) if commit else None
    return dict(fingerprint=fingerprint(root), commit=commit, dirty=bool(changed) if commit else None,
                measured=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
