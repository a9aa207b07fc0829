"""The module graph of the project (its top-level modules): layers <- models <- shared helpers <- scripts.

Read from the source with `ast`, every import counted, those inside functions too: no script imports
another script, no module imports a script, and the project's imports have no cycle.
"""

import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = {"train_nmt", "pretrain_bert", "analyze_grads"}


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
