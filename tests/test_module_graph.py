"""The module graph of the project: its face at the top level, the machinery of the scripts in the package
harness/, the reproduction and its verification in the package reproduction/.

Read from the source with `ast`, every import counted, those inside functions too, and a module named to
`importlib.import_module` or `__import__` as well; a module loaded by file path (`spec_from_file_location`,
`runpy.run_path`, `SourceFileLoader`) is refused, since no graph can follow it. The top level holds
the card's modules and at most a few more; no module imports a script; layers.py imports nothing of the
project, models.py only layers.py; the project's imports have no cycle. Imports sit at the top of each
module, except backend-specific ones (jax, tensorflow, torch) and, in each script, the one import of its
Keras side (harness/cli.py says why); the scripts' command-line side imports no Keras. Private Keras and
JAX API is reached from one module, and each shared constant is defined once.
"""

import ast
import os
import re
import subprocess
import sys

import pytest

from conftest import once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = once("imports read from the source", backend="tensorflow")
PACKAGE = "harness"
PACKAGES = (PACKAGE, "reproduction")
# the scripts beside the results they write (python results/tables.py), named as modules
FOLDER_SCRIPTS = ("results/tables.py",)
CARD = {"layers", "models", "schedules", "train_nmt", "pretrain_bert", "analyze_grads"}
SCRIPTS = {"train_nmt", "pretrain_bert", "analyze_grads", "reproduce"}
KERAS_SIDE = {"train_nmt": "harness.nmt_job", "pretrain_bert": "harness.bert_job", "analyze_grads": "harness.grads_job"}
BACKEND_SPECIFIC = ("jax", "tensorflow", "torch", "keras.src.backend")
PRIVATE_API = "harness.private_api"


def project_modules():
    """The project's modules: "layers", ... at the top level, "harness.cli", ... in the package."""
    top = [name[:-3] for name in os.listdir(ROOT) if name.endswith(".py")]
    inside = []
    for package in PACKAGES:
        folder = os.path.join(ROOT, package)
        inside += [f"{package}.{name[:-3]}" for name in os.listdir(folder) if name.endswith(".py")
                   and name != "__init__.py"] if os.path.isdir(folder) else []
    scripts = [path[:-3].replace("/", ".") for path in FOLDER_SCRIPTS if os.path.exists(os.path.join(ROOT, path))]
    return sorted(top + inside + scripts)


def source(module):
    return open(os.path.join(ROOT, *module.split(".")) + ".py", encoding="utf-8").read()


def _imported(node):
    """The dotted names an import statement imports: `from harness import cli` gives "harness.cli"."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level or not node.module:
        return []
    if node.module in PACKAGES:
        return [f"{node.module}.{alias.name}" for alias in node.names]
    return [node.module]


BY_PATH = ("spec_from_file_location", "run_path", "SourceFileLoader", "load_source")


def _called(node):
    """The name a call node calls: `importlib.import_module(...)` gives "import_module"."""
    function = node.func
    return function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)


def dynamic_imports(tree):
    """The dotted names a module imports by call, `importlib.import_module("harness.glue")` or
    `__import__("harness.glue")`, where the name is a string in the code."""
    return [node.args[0].value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and _called(node) in ("import_module", "__import__") and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)]


def loads_by_path(module):
    """The lines at which `module` loads Python code by file path (which no import graph can follow)."""
    return [node.lineno for node in ast.walk(ast.parse(source(module)))
            if isinstance(node, ast.Call) and _called(node) in BY_PATH]


def _project_module(name, known):
    """The project module a dotted import name refers to, or None."""
    parts = name.split(".")
    for length in (2, 1):
        if ".".join(parts[:length]) in known:
            return ".".join(parts[:length])
    return None


def imports(module, known):
    """The project modules that `module` imports anywhere in its file."""
    found = set()
    tree = ast.parse(source(module))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found |= {_project_module(name, known) for name in _imported(node)}
    found |= {_project_module(name, known) for name in dynamic_imports(tree)}
    return (found & set(known)) - {module}


def graph():
    known = project_modules()
    return {module: imports(module, known) for module in known}


def function_imports(module):
    """(function name, imported name) for every import inside a function of `module`."""
    found = []
    for function in ast.walk(ast.parse(source(module))):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found += [(function.name, name) for name in _imported(node)]
    return found


def top_imports(module):
    """The dotted names `module` imports at its top level (not inside a function or class)."""
    tree = ast.parse(source(module))
    return {name for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) for name in _imported(node)}


def misplaced_imports():
    """Imports inside functions that are neither backend-specific nor a script's import of its Keras side
    (nor the backend check's own `import keras`)."""
    allowed = {("harness.cli", "check_backend", "keras"), ("harness.console", "_progbar", "keras")}  # a bar: Keras's
    allowed |= {("reproduction.worker", "run", side) for side in ("harness.glue", "train_nmt", "pretrain_bert",
                                                                   "analyze_grads")}
    # each script's run, top to bottom (train_nmt.py's `train`, pretrain_bert.py's `pretrain`, analyze_grads.py's
    # `analyze`), imports the Keras side it calls
    allowed |= {("train_nmt", "train", side) for side in ("keras", "harness.devices", "harness.nmt_data", "harness.nmt_job",
                                                           "harness.devices", "harness.callbacks",
                                                           "harness.plots", "harness.files", "harness.rundir")}
    allowed |= {("analyze_grads", "analyze", side) for side in ("keras", "harness.devices", "harness.grads_job")}
    allowed |= {("pretrain_bert", "pretrain", side) for side in ("keras", "numpy", "harness.bert_data", "harness.bert_job",
                                                                 "harness.devices", "harness.callbacks", "harness.plots",
                                                                 "harness.files", "harness.rundir", "schedules")}
    allowed |= {("pretrain_bert", "run", side) for side in ("harness.glue", "reproduction.sweeps")}  # --finetune, --sweep
    # train_nmt.py's other modes, each a corner the training path does not import: --benchmark, --translate and
    # --eval-only (with the process-wide settings of `devices.tune_runtime`), and --sweep (the Ray runner)
    allowed |= {("train_nmt", "run", side) for side in ("harness.benchmark", "harness.devices", "harness.translate")}
    allowed |= {("train_nmt", "eval_only", side) for side in ("harness.nmt_job", "harness.translate")}
    allowed |= {("train_nmt", "sweep", "reproduction.sweeps"), ("train_nmt", "run", "harness.files")}
    allowed |= {("train_nmt", "prepare_corpus", side) for side in ("harness.iwslt14", "harness.wmt14")}  # corpora
    allowed.add(("harness.nmt_data", "load_corpus", "harness.synthetic"))  # the tests' corpus: off a default run's path
    allowed.add((PRIVATE_API, "keep_tensorflow_out", "keras.src.utils"))  # Keras's own flag, when the backend is known
    # the papers' comparisons (reproduction/experiments.py), which a training run does not load: --sweep and --runs
    allowed |= {("train_nmt", "sweep", "reproduction.experiments"), ("train_nmt", "check_args", "reproduction.experiments"),
                ("pretrain_bert", "run", "reproduction.experiments")}
    allowed |= {("reproduction.runner", function, "ray") for function in ("run_one", "__init__")}  # Ray where it is used
    return sorted((module, function, name) for module in project_modules()
                  for function, name in function_imports(module) if not name.startswith(BACKEND_SPECIFIC) and (module, function, name) not in allowed)


def keras_on_the_command_line_side(starts=SCRIPTS):
    """Modules that a script imports when it starts (its top-level imports, followed through the project)
    and that import Keras themselves: (script, module)."""
    known = set(project_modules())
    found = []
    for script in sorted(set(starts) & known):
        seen, todo = set(), [script]
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            names = top_imports(module)
            if any(name.split(".")[0] == "keras" for name in names):
                found.append((script, module))
            todo += [m for m in (_project_module(name, known) for name in names) if m]
    return found


def private_api_users():
    """Modules whose code names `keras.src` or `jax._src` (in an import or an attribute), or overrides a
    private method of a Keras callback."""
    pattern = re.compile(r"\b(keras\.src|jax\._src)\b|def _(should_save_on_batch|save_model)\b|\._loss_tracker\b")
    users = []
    for module in project_modules():
        tree = ast.parse(source(module))
        code = ast.unparse([n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))])
        if pattern.search(code):
            users.append(module)
    return users


def definitions_of(names):
    """{name: [modules that assign it at their top level]} for the given constant names."""
    found = {name: [] for name in names}
    for module in project_modules():
        for node in ast.parse(source(module)).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name) and leaf.id in found:
                        found[leaf.id].append(module)
    return found


def string_users(text):
    """Modules whose code (docstrings and comments aside) holds the string constant `text`."""
    users = []
    for module in project_modules():
        tree = ast.parse(source(module))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(
            n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body and isinstance(n.body[0], ast.Expr)}
        if any(isinstance(n, ast.Constant) and n.value == text and id(n) not in docstrings for n in ast.walk(tree)):
            users.append(module)
    return users


def test_the_top_level_is_the_card_and_at_most_three_more():
    top = {module for module in project_modules() if "." not in module}
    assert CARD <= top and len(top) <= 9, sorted(top - CARD)


def test_no_module_imports_a_script_but_the_worker_its_run():
    """A script is a command, not a library; reproduction/worker.py alone imports the three, to call their runs
    (`train`, `pretrain`, `analyze`) for one run of an experiment, in a process of its own."""
    offenders = {module: sorted(deps & SCRIPTS) for module, deps in graph().items() if deps & SCRIPTS}
    assert offenders == {"reproduction.worker": ["analyze_grads", "pretrain_bert", "train_nmt"]}


def test_layers_import_nothing_of_the_project_and_models_only_layers():
    edges = graph()
    assert edges["layers"] == set()
    assert edges["harness.specs"] <= {"harness.console", "harness.files"}  # the flags' choices, without Keras
    assert edges["models"] <= {"layers"}


def test_private_keras_and_jax_api_is_reached_from_one_module():
    assert private_api_users() == [PRIVATE_API]


def test_each_shared_constant_has_one_home():
    homes = definitions_of(["NORMS", "NORM_NAMES", "OPTIMIZERS", "SCHEDULES", "MODES", "PRECISIONS", "DECODING",
                            "MAX_LEN", "PEER_TIMEOUT_S", "STATE"])
    # layers.py keeps its own copy, so that a pasted class needs only Keras; tests/test_layers.py checks
    # that the two are equal.
    assert homes.pop("NORMS") == ["harness.specs", "layers"]
    assert {name: modules for name, modules in homes.items() if len(modules) != 1} == {}


def test_one_module_names_state_json():
    """Only harness/files.py spells the file's name (`STATE`); harness/rundir.py alone reads and writes it."""
    assert string_users("state.json") == ["harness.files"]
    users = [module for module in project_modules() if re.search(r"\bSTATE\b", source(module))]
    assert sorted(users) == ["harness.files", "harness.rundir"]


def test_a_runs_outcome_files_are_named_by_rundir_alone():
    """results.json, metrics.csv, placement.json and train.log are spelled in harness/rundir.py only: the
    runner, the publishing into results/ and the numerics check reach them through `RunDir` and its names."""
    for name in ("results.json", "metrics.csv", "placement.json", "train.log"):
        assert string_users(name) == ["harness.rundir"], name


def test_the_imports_have_no_cycle():
    edges, state, path = graph(), {}, []

    def visit(module):  # depth-first; a module met again while on the path closes a cycle
        state[module] = "open"
        path.append(module)
        for dep in sorted(edges[module]):
            if state.get(dep) == "open":
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(dep):] + [dep]))
            if dep not in state:
                visit(dep)
        path.pop()
        state[module] = "done"

    for module in edges:
        if module not in state:
            visit(module)


def test_imports_are_at_the_top_except_backend_specific_ones_and_the_keras_side():
    assert misplaced_imports() == []


def test_the_scripts_start_without_keras():
    """--help and the one-line error for a bad KERAS_BACKEND need no backend (test_train_nmt runs them)."""
    assert keras_on_the_command_line_side() == []


def top_closure(starts):
    """The project modules that `starts` load at their top levels, followed through the project."""
    known = set(project_modules())
    seen, todo = set(), list(starts)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += [m for m in (_project_module(name, known) for name in top_imports(module)) if m]
    return seen


# the corpus preparations are not on a training run's path (--translate's raw text reads IWSLT14's tokenizer
# and BPE: harness/translate.py, a mode of its own), nor is any module of the package reproduction/
OFF_THE_RUN = ("harness.wmt14", "harness.iwslt14", "harness.translate")


def off_the_run(module):
    return module in OFF_THE_RUN or module.startswith("reproduction.")


@pytest.mark.parametrize("script", sorted(KERAS_SIDE))
def test_a_training_run_loads_neither_the_reproduction_nor_a_corpus_preparation(script):
    """A script and its job (what one run loads) import no module of reproduction/, nor `OFF_THE_RUN`, at their
    tops."""
    assert sorted(filter(off_the_run, top_closure([script, KERAS_SIDE[script]]))) == []


def test_only_the_sweep_branches_reach_the_reproduction():
    """The science, harness/ and the training scripts import reproduction/ nowhere but in a --sweep's branch
    (train_nmt.py's `sweep` and `check_args` for --runs, pretrain_bert.py's `run`): the package stays outside
    the code fingerprint (harness/rundir.py) because no run's numbers can depend on it."""
    allowed = {("train_nmt", "sweep"), ("train_nmt", "check_args"), ("pretrain_bert", "run")}
    found = []
    for module in project_modules():
        if module.startswith(("reproduction.", "results.")) or module in ("reproduce",):
            continue
        found += [(module, name) for name in top_imports(module) if name.startswith("reproduction")]
        found += [(module, function, name) for function, name in function_imports(module)
                  if name.startswith("reproduction") and (module, function) not in allowed]
    assert found == []


def test_no_module_is_loaded_by_file_path():
    """Every module is reached by an import the graph sees: none by `importlib.util.spec_from_file_location`,
    `runpy.run_path` and the like."""
    assert {module: lines for module in project_modules() if (lines := loads_by_path(module))} == {}


def test_the_scripts_start_without_ray():
    """A command line that starts no run through the runner (--help, one run, a refusal) does not load Ray."""
    code = "import sys, train_nmt, pretrain_bert, analyze_grads, reproduce; print(sorted(m for m in sys.modules if m == 'ray'))"
    found = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"


def test_the_pytorch_reference_loads_no_keras():
    """bench/torch_reference.py shares harness/flops.py with the benchmark; a Keras import there would load Keras
    (and TensorFlow) into the reference's process."""
    reference = os.path.join(ROOT, "bench", "torch_reference.py")
    tree = ast.parse(open(reference, encoding="utf-8").read())
    used = {name for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) for name in _imported(node)}
    assert "keras" not in used and {"harness.flops", "harness.console"} <= used
    assert keras_on_the_command_line_side(used) == []


def test_the_import_checks_can_fail(tmp_path, monkeypatch):
    """A Keras import inside a function, and a script whose command line imports a module that imports Keras."""
    for name, text in (("helper", "import keras\n"),
                       ("train_nmt", "import helper\n\ndef train(spec, out):\n    from harness import nmt_job\n"),
                       ("lazy", "def f():\n    import keras\n    import jax\n")):
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    assert misplaced_imports() == [("lazy", "f", "keras")]
    assert keras_on_the_command_line_side() == [("train_nmt", "helper")]


def test_the_check_finds_a_cycle_and_a_script_import(tmp_path, monkeypatch):
    """The checks above can fail: two modules that import each other, and one that imports a script."""
    for name, text in (("a", "import b\n"), ("b", "def f():\n    from a import x\n"), ("c", "import train_nmt\n"),
                       ("train_nmt", "")):
        (tmp_path / f"{name}.py").write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    edges = graph()
    assert edges["a"] == {"b"} and edges["b"] == {"a"} and edges["c"] == {"train_nmt"}
    assert "a -> b -> a" in failure(test_the_imports_have_no_cycle)
    assert failure(test_no_module_imports_a_script_but_the_worker_its_run) is not None  # c imports train_nmt
    # the same cycle through importlib, and a load by path
    (tmp_path / "b.py").write_text("import importlib\n\ndef f():\n    return importlib.import_module('a')\n")
    (tmp_path / "d.py").write_text("import importlib.util\nS = importlib.util.spec_from_file_location('e', 'e.py')\n")
    assert graph()["b"] == {"a"} and loads_by_path("d") == [2]
    assert "a -> b -> a" in failure(test_the_imports_have_no_cycle)
    assert "'d': [2]" in failure(test_no_module_is_loaded_by_file_path)


def failure(check):
    """What `check` (a test of this file) says when it fails, or None when it passes."""
    try:
        check()
    except AssertionError as error:
        return str(error)
    return None


def test_the_package_checks_can_fail(tmp_path, monkeypatch):
    """Package modules count as modules; private API outside harness/private_api.py, a constant defined
    twice, state.json spelled outside harness/files.py, and a tenth top-level module are all found."""
    (tmp_path / PACKAGE).mkdir()
    files = {"harness/constants.py": "NORMS = ('post',)\n",
             "harness/private_api.py": "def f():\n    from jax._src import distributed\n",
             "harness/files.py": "STATE = 'state.json'\n",
             "harness/rundir.py": "from harness.files import STATE\n",
             "harness/job.py": "from harness import files\nfrom keras.src import ops\nP = 'state.json'\n",
             "cli.py": "NORMS = ('post',)\n"}
    files.update({f"{name}.py": "from harness import constants\n" for name in CARD | {"m1", "m2", "m3", "m4"}})
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    assert graph()["harness.job"] == {"harness.files"} and graph()["layers"] == {"harness.constants"}
    assert private_api_users() == ["harness.job", PRIVATE_API]
    assert definitions_of(["NORMS"]) == {"NORMS": ["cli", "harness.constants"]}
    assert string_users("state.json") == ["harness.files", "harness.job"]
    try:
        test_the_top_level_is_the_card_and_at_most_three_more()
    except AssertionError:
        pass
    else:
        raise AssertionError("ten top-level modules were not found")
