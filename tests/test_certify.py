"""reproduce.py --certify (reproduction/certify.py): it certifies a change that keeps every number, and refuses one
that moves a number, one the check never runs, and changed data.

Each test edits a copy of this project, committed into a repository of its own as the "measured" code,
whose outputs on this host are recorded first; the check is cut to one of its steps (a two-epoch
translation run) so that each certification takes seconds.
"""

import contextlib
import json
import os
import shutil
import subprocess

import pytest

from conftest import once
from harness import rundir
from reproduction import certify, changes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = once("the numerics check (its steps choose their own backends)", backend="tensorflow")
STEPS = tuple(step for step in certify.STEPS if step.name == "post-step-nowarmup")


def _git(cwd, *argv):
    return subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@example.com", *argv], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """(copy, its fingerprint): this checkout's files, committed in a repository of their own, with the
    outputs of STEPS on its code recorded in its results/certify/."""
    copy = tmp_path_factory.mktemp("project")
    for name in _git(ROOT, "ls-files", "--cached", "--others", "--exclude-standard").splitlines():
        if os.path.isfile(os.path.join(ROOT, name)) and not name.startswith("results/certify/"):
            os.makedirs(os.path.dirname(copy / name), exist_ok=True)
            shutil.copyfile(os.path.join(ROOT, name), copy / name)
    _git(copy, "init", "-q")
    _git(copy, "add", "-A")
    _git(copy, "commit", "-q", "-m", "the measured code")
    fingerprint = rundir.fingerprint(str(copy))
    made = certify.record(str(copy), fingerprint, str(tmp_path_factory.mktemp("record")), say=lambda *_: None,
                          steps=STEPS, commit=_git(copy, "rev-parse", "HEAD"))
    assert made["steps"] == ["post-step-nowarmup"] and len(made["outputs"]) > 50
    return copy, fingerprint


@contextlib.contextmanager
def edited(path, old, new):
    """`path` with the first `old` replaced by `new`, put back afterwards."""
    text = path.read_bytes()
    assert old.encode() in text, f"{old!r} is not in {path}"
    path.write_bytes(text.replace(old.encode(), new.encode(), 1))
    try:
        yield
    finally:
        path.write_bytes(text)


def certify_copy(copy, fingerprint, tmp_path):
    return certify.certify(str(copy), steps=STEPS, work=str(tmp_path), say=lambda *_: None, against=fingerprint)


def test_a_refactor_that_keeps_every_number_is_certified(measured, tmp_path):
    copy, fingerprint = measured
    with edited(copy / "layers.py", "        variance = ops.mean(ops.square(centred), axis=-1, keepdims=True)\n",
                "        squared = ops.square(centred)\n        variance = ops.mean(squared, axis=-1, keepdims=True)\n"):
        today = rundir.fingerprint(str(copy))
        assert today != fingerprint  # a statement changed, so the rows would be stale without a certificate
        made = certify_copy(copy, fingerprint, tmp_path)
        assert made["fingerprint"] == today and made["refused"] == {}
        assert made["jobs"]["translation"] == fingerprint  # the one job whose steps ran
        assert certify.certified_as(today, str(copy), "translation") == fingerprint
        assert certify.certified_as(today, str(copy), "bert") == today  # no step of it ran: not certified
        assert made["hash"] == certify.records(str(copy), fingerprint)[0]["hash"]


@pytest.mark.parametrize("path, old, new", [
    ("layers.py", "LAYER_NORM_EPSILON = 1e-5", "LAYER_NORM_EPSILON = 1e-6"),
    ("harness/specs.py", 'label_smoothing: float = setting(0.1, group="training",', 'label_smoothing: float = setting(0.11, group="training",'),
], ids=["layer-norm-epsilon", "label-smoothing-default"])
def test_a_changed_constant_is_refused_naming_the_first_output_that_differs(measured, tmp_path, path, old, new):
    copy, fingerprint = measured
    with edited(copy / path, old, new):
        with pytest.raises(certify.Refused) as refusal:
            certify_copy(copy, fingerprint, tmp_path)
    # the outputs are compared in order: the first is the checkpoint's weights, written after epoch 1
    assert str(refusal.value).startswith(f"an output differs from code {fingerprint}'s: "
                                         "post-step-nowarmup/checkpoints/epoch1.keras was ")
    assert not os.path.exists(copy / certify.CERTIFICATES) or rundir.fingerprint(str(copy)) not in \
        certify.certificates(str(copy))


def test_a_changed_branch_the_check_never_runs_is_refused_with_its_line(measured, tmp_path):
    copy, fingerprint = measured
    anchor = '        y = y + ops.cast(self.beta, "float32")\n'
    with edited(copy / "layers.py", anchor, anchor + "        if len(x.shape) > 8:\n            y = y * 2.0\n"):
        line = (copy / "layers.py").read_text().splitlines().index("            y = y * 2.0") + 1
        with pytest.raises(certify.Refused) as refusal:
            certify_copy(copy, fingerprint, tmp_path)
    message = str(refusal.value)
    assert message.startswith("1 statement changed since commit") and "never ran in the check" in message
    assert message.endswith(f"layers.py:{line} y = y * 2.0")  # the test above it ran, so it is not named


def test_changed_data_are_re_measured_not_certified(measured, tmp_path):
    copy, fingerprint = measured
    notes = copy / "data" / "README.md"
    with edited(notes, "\n", "\nA clearer sentence.\n"):  # a .md file is not fingerprinted: it passes ...
        assert rundir.fingerprint(str(copy)) == fingerprint
    sample = copy / "data" / "wikipedia" / "enwiki-sample.txt.bz2"
    with edited(sample, "", ""):  # ... a shipped corpus that the step does not read is refused all the same
        sample.write_bytes(sample.read_bytes()[:-1] + bytes([sample.read_bytes()[-1] ^ 1]))
        with pytest.raises(certify.Refused, match=rf"shipped data differ from code {fingerprint}'s: "
                                                  r"data/wikipedia/enwiki-sample.txt.bz2; a change of data is re-measured"):
            certify_copy(copy, fingerprint, tmp_path)


def test_a_raise_and_an_except_clause_that_only_raises_cannot_move_a_number():
    source = ("try:\n    x = f()\nexcept OSError:\n    raise SystemExit(2)\nexcept ValueError:\n    x = 0\n"
              "if x:\n    raise ValueError(x)\n")
    assert changes.needs(source, 3) is None and changes.needs(source, 4) is None and changes.needs(source, 8) is None
    assert list(changes.needs(source, 5)) == [6]  # a clause that goes on: seen when its body runs
    assert list(changes.needs(source, 7)) == [7] and list(changes.needs(source, 2)) == [2]


def test_a_definition_that_left_its_module_marks_no_neighbour_but_a_shadowing_one_does():
    """Removed code marks the lines on either side as changed (they must run in the check), unless it is whole
    top-level definitions whose names the module now binds only in changed statements: moved elsewhere."""
    old = "import os\n\n\ndef f():\n    return 1\n\n\ndef g():\n    return os.sep\n\n\ndef h():\n    return 2\n"
    moved = "import os\nfrom x import g\n\n\ndef f():\n    return 1\n\n\ndef h():\n    return 2\n"
    assert changes.changed_lines(old, moved) == {2}  # the import that brings g back: a change that must run
    assert changes.changed_lines(old, moved.replace("from x import g\n", "")) == set()
    shadowed = "from x import g\n\n\ndef f():\n    return 1\n\n\ndef g():\n    return 3\n\n\ndef h():\n    return 2\n"
    unshadowed = "from x import g\n\n\ndef f():\n    return 1\n\n\ndef h():\n    return 2\n"
    assert changes.changed_lines(shadowed, unshadowed) == {5, 8}  # g now means x's: f's end and h's start
    part = changes.changed_lines("def f():\n    a = 1\n    b = 2\n    return a\n", "def f():\n    a = 1\n    return a\n")
    assert part == {2, 3}


def _trees(tmp_path, old, new):
    """Two project trees holding `old` and `new` ({file: text}) in harness/."""
    for tree, files in (("old", old), ("new", new)):
        os.makedirs(tmp_path / tree / "harness")
        for name, text in files.items():
            (tmp_path / tree / "harness" / name).write_text(text)
    return str(tmp_path / "old"), str(tmp_path / "new")


@pytest.mark.parametrize("edit, also", [(None, set()), (("LIMIT = 3", "LIMIT = 4"), {10, 11}),
                                        (("return args", "return args[::-1]"), {7, 10, 11}),
                                        (("x, LIMIT)", "x, LIMIT, __name__)"), {10, 11})])
def test_a_function_moved_unchanged_into_another_module_is_no_change(tmp_path, edit, also):
    """Merging modules moves functions: one that another fingerprinted file held with the same code, each name it
    reads bound alike, computes what it did (only the imports and constants it brought, which run on import,
    change). It is a change when a name it reads now means something else (a constant, a helper whose code
    differs), or when it reads the name of its module."""
    old = {"a.py": 'import os\nfrom harness.b import helper\nLIMIT = 3\n\n\ndef f(x):\n    """The sum."""\n'
                   "    return helper(os.sep, x, LIMIT)\n",
           "b.py": "def helper(*args):\n    return args\n"}
    new = ("import os\n\nLIMIT = 3\n\n\ndef helper(*args):\n    return args\n\n\ndef f(x):  # moved\n"
           "    return helper(os.sep, x, LIMIT)\n")
    new = new.replace(*edit) if edit else new
    changed, _ = changes.changed_since(*_trees(tmp_path, old, {"b.py": new}))
    assert set(changed["harness/b.py"]) == {1, 3} | also


def test_a_moved_function_is_a_change_where_its_module_could_make_it_differ(tmp_path):
    """A function moved into a module with a star import (whose names no one can read off the page), one that reads
    `__file__` from another folder, and a moved class (Keras saves a class by its module) are changes."""
    old = {"harness/a.py": "import os\n\n\ndef f():\n    return os.sep\n\n\ndef g():\n    return __file__\n\n\n"
                           "class C:\n    def m(self):\n        return 1\n"}
    new = {"harness/b.py": "import os\nfrom os.path import *\n\n\ndef f():\n    return os.sep\n",
           "harness/c.py": "def g():\n    return __file__\n\n\nclass C:\n    def m(self):\n        return 1\n",
           "d.py": "def g():\n    return __file__\n"}
    for tree, files in (("old", old), ("new", new)):
        for name, text in files.items():
            (tmp_path / tree / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / tree / name).write_text(text)
    old_tree, new_tree = str(tmp_path / "old"), str(tmp_path / "new")
    everything = set(range(1, 20))
    assert changes.moved_unchanged(old_tree, new_tree, "harness/b.py", everything) == set()  # the star import
    assert changes.moved_unchanged(old_tree, new_tree, "harness/c.py", everything) == {1, 2}  # g, not C
    assert changes.moved_unchanged(old_tree, new_tree, "d.py", everything) == set()  # __file__ in another folder


def test_a_moved_function_reading_a_name_through_too_many_re_exports_is_a_change(tmp_path):
    """A name the check cannot follow to its definition (here through nine re-exports, one more than it follows)
    is bound to nothing known, on either side: the moved function counts as changed."""
    chain = {f"m{i}.py": f"from harness.m{i + 1} import helper\n" for i in range(9)}
    chain["m9.py"] = "def helper():\n    return 1\n"
    old = {"a.py": "from harness.m0 import helper\n\n\ndef f():\n    return helper()\n", **chain}
    new = {"b.py": "from harness.m0 import helper\n\n\ndef f():\n    return helper()\n", **chain}
    old_tree, new_tree = _trees(tmp_path, old, new)
    assert changes.moved_unchanged(old_tree, new_tree, "harness/b.py", set(range(1, 6))) == set()
    near = {"m8.py": chain["m8.py"], "m9.py": chain["m9.py"]}  # two re-exports: followed
    old_tree, new_tree = _trees(tmp_path / "near", {"a.py": old["a.py"].replace("m0", "m8"), **near},
                                {"b.py": new["b.py"].replace("m0", "m8"), **near})
    assert changes.moved_unchanged(old_tree, new_tree, "harness/b.py", set(range(1, 6))) == {4, 5}


def test_a_renamed_parameter_is_no_change_unless_a_name_now_reads_another_variable():
    """A function's parameters compare by their place: renaming one with every use of it changes no statement.
    A rename that captures a module's name, a call passing the old name by keyword, and a method's argument
    (Keras reads a layer's by name) are changes."""
    old = "import devices\n\n\ndef f(args, x=1):\n    y = args.a + x\n    return lambda z: z + args.b, y\n"
    assert changes.changed_lines(old, old.replace("args", "settings")) == set()
    old_reads_module = "import devices\n\n\ndef f(args):\n    return devices.go(args)\n"
    assert changes.changed_lines(old_reads_module, old_reads_module.replace("args", "devices")) == {5}
    assert changes.changed_lines("f(args=1)\n", "f(settings=1)\n") == {1}
    method = "class A:\n    def __init__(self, a):\n        self.a = a\n"
    assert changes.changed_lines(method, method.replace(", a)", ", b)").replace("= a", "= b")) == {2, 3}
    by_name = "import jax\n\n\ndef f(a):\n    return a\n\n\ng = jax.jit(f, static_argnames=('a',))\n"
    assert changes.changed_lines(by_name, by_name.replace("(a)", "(b)").replace("return a", "return b")) == {4, 5}
    inspects = "import inspect\n\n\ndef f(a):\n    return a\n\n\ng = inspect.signature(f)\n"
    assert changes.changed_lines(inspects, inspects.replace("(a)", "(b)").replace("return a", "return b")) == {4, 5}
    bleu = "def f(x, metric):\n    return x, metric.get_signature()\n"  # sacrebleu's signature: no parameter read
    assert changes.changed_lines(bleu, bleu.replace("x", "y")) == set()


def test_the_miniature_iwslt14_release_is_one_the_preparation_reads(tmp_path):
    """The check's {iwslt14} input: the release's members, named as harness/iwslt14.py reads them, its test
    sets sharing the small corpus's test pairs."""
    from harness import iwslt14

    assert certify.IWSLT14_TEST_SETS == iwslt14.TEST_SETS
    folders = certify.write_inputs(ROOT, str(tmp_path))
    pair, texts = iwslt14.load_release(os.path.join(folders["iwslt14"], "de-en.tgz"), "de", "en")
    splits = iwslt14.preprocess("de-en.tgz", pair, texts, log=lambda *_: None)
    with open(os.path.join(folders["small"], "test.de"), encoding="utf-8") as f:
        assert len(splits["test"][0]) == len(f.read().splitlines()) and len(splits["train"][0]) > 100


def test_certificates_are_followed_from_code_to_code(tmp_path):
    """Code C certified to give code B's numbers, and B code A's, gives A's; a job B's certificate refused
    stays B's."""
    folder = tmp_path / "results" / "certify"
    folder.mkdir(parents=True)
    (folder / "certificates.json").write_text(json.dumps({
        "C": {"jobs": {"translation": "B", "bert": "B", "analysis": "B"}},
        "B": {"jobs": {"translation": "A", "bert": "B", "analysis": "A"}}}))
    assert certify.certified_as("C", str(tmp_path), "translation") == "A"
    assert certify.certified_as("C", str(tmp_path), "bert") == "B"
    assert certify.certified_as("A", str(tmp_path), "translation") == "A"
    assert certify.certified_as("C", str(tmp_path)) == "C"  # the jobs differ: no one code for all
