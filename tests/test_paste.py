"""The paste test: a class of layers.py, pasted with only `import keras`, `from keras import ops` and the definitions
the module docstring lists for it, runs; so does each class's `Example:`.

The pasted code runs in one fresh Python process: its `register_keras_serializable` decorators would otherwise
replace the registrations of the layers module this test process has imported.
"""

import ast
import json
import os
import re
import subprocess
import symtable
import sys
import textwrap

import pytest
from conftest import NORMS

LAYERS_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "layers.py")
HEADER = ["import keras", "from keras import ops"]
BLOCKS = ("ResidualNorm", "MultiHeadAttention", "FeedForward", "TransformerEncoderBlock", "TransformerDecoderBlock")


def read_layers():
    """layers.py's source and its tree."""
    with open(LAYERS_PY, encoding="utf-8") as f:
        source = f.read()
    return source, ast.parse(source)


def definitions(source, tree):
    """{name: source text} of layers.py's top-level definitions (decorators included), in file order."""
    lines = source.splitlines()
    result = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        result[name] = "\n".join(lines[start - 1:node.end_lineno])
    return result


def docstring_lists(tree):
    """The module docstring's "Pasting a class" lists: {class: [entries as written]}."""
    doc = ast.get_docstring(tree)
    section = doc.split("Pasting a class", 1)[1].split("\n\n", 1)[0]
    lists, current = {}, None
    for line in section.splitlines()[1:]:
        entry = re.match(r"^ {4}(\w+):\s+(.*)$", line)
        if entry:
            current = entry.group(1)
            lists[current] = entry.group(2)
        elif current is not None and line.startswith(" " * 6):
            lists[current] += " " + line.strip()
    return {name: [item.strip() for item in text.split(",")] for name, text in lists.items()}


def needs(name, lists):
    """What the docstring says a paste of `name` needs: (imports, definitions), a listed class bringing its own."""
    imports, names = [], set()
    for item in lists[name]:
        match = re.fullmatch(r"`(import \w+)`", item)
        if match:
            imports.append(match.group(1))
        else:
            assert re.fullmatch(r"\w+", item), f"not a name in {name}'s list: {item!r}"
            names.add(item)
            if item in lists:
                more_imports, more = needs(item, lists)
                imports += [i for i in more_imports if i not in imports]
                names |= more
    return imports, names


def paste(names, imports, source, tree):
    """A module text: the header, `imports`, then the definitions `names` in layers.py's order."""
    defs = definitions(source, tree)
    missing = sorted(set(names) - set(defs))
    assert not missing, f"the module docstring names what layers.py does not define: {missing}"
    return "\n\n\n".join(["\n".join(HEADER + imports)] + [text for name, text in defs.items() if name in names]) + "\n"


def example(class_source):
    """The code of the ```python block after "Example:" in a class's docstring."""
    doc = ast.get_docstring(ast.parse(class_source).body[0])
    match = re.search(r"Example:\s*```python\n(.*?)```", doc, re.S)
    return textwrap.dedent(match.group(1)) if match else None


def public_classes(tree):
    return [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]


PUBLIC = public_classes(read_layers()[1])


# Runs in the fresh process: imports each pasted module under its own name, runs the cases, prints one JSON line.
DRIVER = r'''
import importlib.util, json, sys, traceback
import numpy as np

def load(name):
    spec = importlib.util.spec_from_file_location(name, name + ".py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

results = {}

def run(case, function):
    try:
        results[case] = function()
    except Exception:
        results[case] = {"error": traceback.format_exc(limit=-3)}

def summary(y):
    y = np.asarray(keras.ops.convert_to_numpy(y))
    return {"shape": list(y.shape), "finite": bool(np.isfinite(y).all())}

import keras
from keras import ops

for name in CLASSES:
    def run_example(name=name):
        namespace = dict(vars(load("pasted_" + name)))
        exec(compile(open("example_" + name + ".py").read(), "example_" + name, "exec"), namespace)
        return {}
    run("example:" + name, run_example)

blocks = {}
run("import:blocks", lambda: blocks.update(module=load("pasted_blocks")) or {})
for norm in NORMS:
    def forward(norm=norm):
        module = blocks["module"]
        deep = {"alpha": 1.7, "beta": 0.4} if norm == "deepnorm" else {}
        x = keras.random.normal((2, 5, 16), seed=1)
        source_mask = ops.convert_to_tensor([[[True] * 5], [[True] * 3 + [False] * 2]])
        memory = module.TransformerEncoderBlock(16, 2, 32, norm=norm, dropout=0.1, **deep)(
            x, padding_mask=source_mask, training=True)
        target = keras.random.normal((2, 4, 16), seed=2)
        out = module.TransformerDecoderBlock(16, 2, 32, norm=norm, dropout=0.1, **deep)(
            target, memory, encoder_padding_mask=source_mask, training=True)
        return {"encoder": summary(memory), "decoder": summary(out)}
    run("forward:" + norm, forward)

results["layers imported"] = "layers" in sys.modules
print("RESULTS " + json.dumps(results))
'''


@pytest.fixture(scope="module")
def pasted(tmp_path_factory):
    """Write the pasted modules and examples, run them in one fresh process; returns its results and the texts."""
    source, tree = read_layers()
    lists = docstring_lists(tree)
    defs = definitions(source, tree)
    directory = tmp_path_factory.mktemp("paste")
    texts = {}
    for name in lists:
        imports, names = needs(name, lists)
        texts[name] = paste(names | {name}, imports, source, tree)
        code = example(defs[name])
        assert code, f"{name} has no Example"
        (directory / f"pasted_{name}.py").write_text(texts[name], encoding="utf-8")
        (directory / f"example_{name}.py").write_text(code, encoding="utf-8")
    imports, names = set(), set(BLOCKS)
    for name in BLOCKS:
        more_imports, more = needs(name, lists)
        imports |= set(more_imports)
        names |= more
    texts["blocks"] = paste(names, sorted(imports), source, tree)
    (directory / "pasted_blocks.py").write_text(texts["blocks"], encoding="utf-8")
    driver = f"CLASSES = {list(lists)!r}\nNORMS = {list(NORMS)!r}\n" + DRIVER
    (directory / "driver.py").write_text(driver, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "driver.py"], cwd=directory, env=env, capture_output=True, text=True,
                          timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULTS ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULTS "):]), texts


def test_layers_imports_only_math_and_keras():
    """A paste needs nothing from the project: layers.py's only imports are these three, at its top."""
    _, tree = read_layers()
    found = [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert found == ["import math", "import keras", "from keras import ops"]
    assert all(isinstance(node, (ast.Import, ast.ImportFrom)) for node in tree.body[1:4])


def test_docstring_lists_every_public_class():
    _, tree = read_layers()
    assert sorted(docstring_lists(tree)) == sorted(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_class_has_an_example(name):
    source, tree = read_layers()
    assert example(definitions(source, tree)[name]), f"{name}'s docstring has no Example: ```python block"


def module_names(source, tree, name):
    """The module-level names of layers.py that the definition `name` uses directly (scope-aware)."""
    top = {n for n in definitions(source, tree)} | {a.asname or a.name for n in tree.body
                                                  if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    used = set()
    for node in tree.body:
        if getattr(node, "name", None) == name or (isinstance(node, ast.Assign) and
                                                   getattr(node.targets[0], "id", None) == name):
            # Decorators, bases and assigned values are evaluated at module level.
            module_level = (list(getattr(node, "decorator_list", [])) + list(getattr(node, "bases", [])) +
                            ([node.value] if isinstance(node, ast.Assign) else []))
            for part in module_level:
                used |= {n.id for n in ast.walk(part) if isinstance(n, ast.Name)}
    tables = [t for t in symtable.symtable(source, LAYERS_PY, "exec").get_children() if t.get_name() == name]
    while tables:
        table = tables.pop()
        used |= {s.get_name() for s in table.get_symbols() if s.is_global() and s.is_referenced()}
        tables += table.get_children()
    return (used & top) - {"keras", "ops"}


@pytest.mark.parametrize("name", PUBLIC)
def test_docstring_list_is_exactly_what_the_class_uses(name):
    """The list names every definition and import the class reaches, and nothing it does not."""
    source, tree = read_layers()
    imports, names = needs(name, docstring_lists(tree))
    reached, todo = set(), [name]
    while todo:
        for used in module_names(source, tree, todo.pop()) - reached:
            reached.add(used)
            todo.append(used)
    reached.discard(name)
    assert {f"import {n}" for n in reached if n not in definitions(source, tree)} == set(imports)
    assert {n for n in reached if n in definitions(source, tree)} == names


def test_pasted_text_has_only_the_header_imports(pasted):
    """The blocks need nothing beyond keras and ops; a class needs at most the imports its list names."""
    _, texts = pasted
    _, tree = read_layers()
    lists = docstring_lists(tree)
    for name, text in texts.items():
        imports = [line for line in text.splitlines() if re.match(r"\s*(import|from)\s", line)]
        assert imports == HEADER + (needs(name, lists)[0] if name != "blocks" else []), name


def test_pasted_code_does_not_import_layers(pasted):
    results, _ = pasted
    assert results["layers imported"] is False


@pytest.mark.parametrize("name", PUBLIC)
def test_example_runs_in_its_paste(pasted, name):
    results, _ = pasted
    assert results[f"example:{name}"] == {}, results[f"example:{name}"].get("error")


@pytest.mark.parametrize("norm", NORMS)
def test_pasted_blocks_forward(pasted, norm):
    """The five classes pasted together with their listed helpers: an encoder and a decoder block run."""
    results, _ = pasted
    assert results["import:blocks"] == {}, results["import:blocks"].get("error")
    result = results[f"forward:{norm}"]
    assert "error" not in result, result["error"]
    assert result["encoder"] == {"shape": [2, 5, 16], "finite": True}
    assert result["decoder"] == {"shape": [2, 4, 16], "finite": True}
