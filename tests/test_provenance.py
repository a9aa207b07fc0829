"""code_version(): the fingerprint moves with a statement, not with a comment or a docstring."""

import os
import shutil

from conftest import once
from harness import rundir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = once("the fingerprint of source files")


def _tree(tmp_path):
    for name in rundir.TOP_LEVEL:
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    shutil.copytree(os.path.join(ROOT, "harness"), tmp_path / "harness",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(os.path.join(ROOT, "data"), tmp_path / "data")
    return tmp_path


def test_statements_only_drops_comments_docstrings_and_blank_lines():
    source = '"""Module."""\n\n\ndef f(x):  # why\n    """Doc\n    string."""\n    # note\n    return x * 2   \n'
    assert rundir.statements_only(source) == "def f(x):\n    return x * 2"


def test_the_fingerprint_follows_statements_and_data_only(tmp_path):
    root = _tree(tmp_path)
    first = rundir.fingerprint(str(root))
    assert first == rundir.fingerprint(ROOT) and len(first) == 12
    layers = root / "layers.py"
    text = layers.read_text()
    layers.write_text(text.replace('"""', '"""A clearer sentence. ', 1) + "\n# a comment at the end\n")
    assert rundir.fingerprint(str(root)) == first  # docstring and comment: the numbers cannot move
    (root / "harness" / "plots.py").write_text("x = 1\n")
    assert rundir.fingerprint(str(root)) == first  # a module that only draws
    (root / "reproduction").mkdir()
    (root / "reproduction" / "experiments.py").write_text("x = 2\n")
    assert rundir.fingerprint(str(root)) == first  # the reproduction's package: each run records its spec
    layers.write_text(text.replace("LAYER_NORM_EPSILON = 1e-5", "LAYER_NORM_EPSILON = 1e-6"))
    changed = rundir.fingerprint(str(root))
    assert changed != first
    layers.write_text(text)
    assert rundir.fingerprint(str(root)) == first
    data = root / "data" / "multi30k" / "val.de.gz"
    data.write_bytes(data.read_bytes() + b"\0")
    assert rundir.fingerprint(str(root)) != first


def test_code_version_is_the_code_the_process_started_with(tmp_path):
    root = str(_tree(tmp_path))
    started = rundir.code_version(root)
    layers = tmp_path / "layers.py"
    layers.write_text(layers.read_text().replace("LAYER_NORM_EPSILON = 1e-5", "LAYER_NORM_EPSILON = 1e-6"))
    assert rundir.fingerprint(root) != started["fingerprint"]  # edited while the run trains ...
    assert rundir.code_version(root) == started  # ... the run still records the code it runs


def test_code_version_names_the_commit_and_the_date():
    version = rundir.code_version()
    assert version["fingerprint"] == rundir.fingerprint()
    assert version["commit"] is None or len(version["commit"]) == 40
    assert len(version["measured"]) == 10 and version["measured"][4] == "-"


def test_the_fingerprint_reads_each_state_of_the_code_once(tmp_path, monkeypatch):
    """What `fingerprint` read is kept in the cache folder under the files' bytes: the same files give the kept
    value without being read again, an edit is read again, and a damaged entry or no cache folder changes
    nothing but the time."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    (tmp_path / "tree").mkdir()
    root = _tree(tmp_path / "tree")
    first = rundir.fingerprint(str(root))
    kept = list((tmp_path / "cache" / "lnplace" / "fingerprints").iterdir())
    assert [k.read_text() for k in kept] == [first] and first == rundir.fingerprint(ROOT)
    kept[0].write_text("0123456789ab")
    assert rundir.fingerprint(str(root)) == "0123456789ab"  # kept: the statements were not read again
    kept[0].write_text("not a fingerprint")
    assert rundir.fingerprint(str(root)) == first and kept[0].read_text() == first
    layers = root / "layers.py"
    layers.write_text(layers.read_text().replace("LAYER_NORM_EPSILON = 1e-5", "LAYER_NORM_EPSILON = 1e-6"))
    changed = rundir.fingerprint(str(root))
    assert changed != first and len(list(kept[0].parent.iterdir())) == 2
    monkeypatch.setenv("LNPLACE_FINGERPRINTS", str(tmp_path / "other"))
    assert rundir.fingerprint(str(root)) == changed and len(list((tmp_path / "other").iterdir())) == 1
    monkeypatch.delenv("LNPLACE_FINGERPRINTS")
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # no folder can be made there
    assert rundir.fingerprint(str(root)) == changed
