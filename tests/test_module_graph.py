"""The module graph of the project (its top-level modules): layers <- models <- shared helpers <- scripts.

Read from the source with `ast`, every import counted, those inside functions too: no script imports
another script, no module imports a script, and the project's imports have no cycle. Imports sit at the
top of each module, except backend-specific ones (jax, tensorflow, torch) and, in each script, the one
import of its Keras side (cli.py says why); the scripts' command-line side imports no Keras.
"""

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = {"train_nmt", "pretrain_bert", "analyze_grads"}
KERAS_SIDE = {"train_nmt": "translation", "pretrain_bert": "pretraining", "analyze_grads": "grad_analysis"}
BACKEND_SPECIFIC = ("jax", "tensorflow", "torch", "keras.src.backend")


def project_modules():
    return sorted(name[:-3] for name in os.listdir(ROOT) if name.endswith(".py"))


def imports(module, known):
    """The project modules that `module` imports anywhere in its file."""
    tree = ast.parse(open(os.path.join(ROOT, f"{module}.py"), encoding="utf-8").read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return (found & set(known)) - {module}


def graph():
    known = project_modules()
    return {module: imports(module, known) for module in known}


def _imported(node):
    """The dotted names an import statement imports from."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [node.module or ""] if node.level == 0 else []


def function_imports(module):
    """(function name, imported name) for every import inside a function of `module`."""
    tree = ast.parse(open(os.path.join(ROOT, f"{module}.py"), encoding="utf-8").read())
    found = []
    for function in ast.walk(tree):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(function):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found += [(function.name, name) for name in _imported(node)]
    return found


def top_imports(module):
    """The dotted names `module` imports at its top level (not inside a function or class)."""
    tree = ast.parse(open(os.path.join(ROOT, f"{module}.py"), encoding="utf-8").read())
    return {name for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)) for name in _imported(node)}


def misplaced_imports():
    """Imports inside functions that are neither backend-specific nor a script's import of its Keras side
    (nor the backend check's own `import keras`)."""
    allowed = {(module, "run", side) for module, side in KERAS_SIDE.items()} | {("cli", "check_backend", "keras")}
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
            todo += [name.split(".")[0] for name in names if name.split(".")[0] in known]
    return found


def test_the_scripts_and_the_layers_are_where_the_card_says():
    assert SCRIPTS | {"layers", "models", "schedules"} <= set(project_modules())


def test_no_module_imports_a_script():
    offenders = {module: sorted(deps & SCRIPTS) for module, deps in graph().items() if deps & SCRIPTS}
    assert offenders == {}


def test_layers_import_no_project_module_and_models_only_layers():
    edges = graph()
    assert edges["layers"] == set()
    assert edges["models"] <= {"layers"}


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


def test_the_pytorch_reference_loads_no_keras():
    """bench/torch_reference.py shares flops.py with the benchmark; a Keras import there would load Keras
    (and TensorFlow) into the reference's process."""
    reference = os.path.join(ROOT, "bench", "torch_reference.py")
    tree = ast.parse(open(reference, encoding="utf-8").read())
    used = {name.split(".")[0] for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
            for name in _imported(node)}
    assert "keras" not in used and {"flops", "errors"} <= used
    assert keras_on_the_command_line_side(used) == []


def test_the_import_checks_can_fail(tmp_path, monkeypatch):
    """A Keras import inside a function, and a script whose command line imports a module that imports Keras."""
    for name, text in (("helper", "import keras\n"),
                       ("train_nmt", "import helper\n\ndef run(args):\n    import translation\n"),
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
    try:
        test_the_imports_have_no_cycle()
    except AssertionError as error:
        assert "a -> b -> a" in str(error)
    else:
        raise AssertionError("the cycle a -> b -> a was not found")
    try:
        test_no_module_imports_a_script()
    except AssertionError:
        pass
    else:
        raise AssertionError("c importing train_nmt was not found")
