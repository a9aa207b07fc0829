"""Which statements of the fingerprinted files changed since a measured code, and whether the numerics check
ran them (reproduction/certify.py refuses a change it could not see).

    changed, data = changed_since(old_tree, new_tree)   # {file: {line: statement}}, [data files that differ]
    missed = unexecuted(changed, new_tree, coverage_data(work))

A top-level function that another fingerprinted file held with the same code, and whose every name means there
what it meant where it was (`moved_unchanged`), is no change: merging modules moves code the check need not
run again. A statement counts as run when one line that its execution needs ran (`needs`): its own line, or for a
compound statement the lines of its header; a `raise` is exempt, since a run it ends reports no number.
The check runs each step under coverage.py (`coverage_rc`), every Python process a step starts too.
"""

import ast
import copy
import difflib
import functools
import os
import re

import coverage

from harness import rundir


RULES_HOMES = ("harness/rundir.py", "harness/provenance.py")  # where a tree defines its fingerprint's rules


def numeric_files(tree):
    """The fingerprinted files of `tree` by its own rules: the TOP_LEVEL and NOT_NUMERIC of its harness/rundir.py
    (harness/provenance.py in older trees), read without importing it (today's rules where they cannot be read)."""
    rules = {"TOP_LEVEL": rundir.TOP_LEVEL, "NOT_NUMERIC": rundir.NOT_NUMERIC}
    for home in RULES_HOMES:
        module = _parse(tree, home)
        for node in module.body if module else ():
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and getattr(node.targets[0], "id", "") in rules:
                try:
                    rules[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    return set(rundir.numeric_files(tree, tuple(rules["TOP_LEVEL"]), set(rules["NOT_NUMERIC"])))


def changed_since(old_tree, new_tree):
    """({file: {line: statement text}} of the statements of today's fingerprinted files that differ from
    `old_tree`'s, or lie next to one removed there; [data files that differ]). Files fingerprinted in
    either tree count (by either's rules); comments, docstrings and blank lines do not."""
    changed, data = {}, []
    for name in sorted(numeric_files(old_tree) | numeric_files(new_tree)):
        old, new = (_read(os.path.join(tree, name)) for tree in (old_tree, new_tree))
        if old == new or new is None:
            continue  # the same bytes, or gone today (what it did is elsewhere now, or nowhere)
        if not name.endswith(".py"):
            data.append(name)
            continue
        new_text = new.decode("utf-8")
        lines = changed_lines(old.decode("utf-8") if old is not None else "", new_text)
        lines -= moved_unchanged(old_tree, new_tree, name, lines)
        if lines:
            text = new_text.splitlines()
            changed[name] = {line: text[line - 1].strip() for line in sorted(lines)}
    return changed, data


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _parse(tree, name):
    """The module `name` of `tree`, parsed, or None."""
    return _parse_text(_read(os.path.join(tree, name)))


@functools.lru_cache(maxsize=512)
def _parse_text(text):
    try:
        return ast.parse(text) if text is not None else None
    except SyntaxError:
        return None


# names and attributes through which code can tell which module holds it: a function that reads one is never
# taken as moved (an object's own `type(x).__name__` is no such attribute)
KNOWS_ITS_MODULE = {"__name__", "__spec__", "__package__", "__loader__", "globals", "vars", "_getframe", "__globals__",
                    "currentframe", "f_globals", "__module__"}


def _code(node, name):
    """A statement of the file `name` as the parser reads it, its docstrings and places aside, with `__file__`
    standing for the file's folder (as it does)."""
    node = copy.deepcopy(node)
    for inner in ast.walk(node):
        if getattr(inner, "body", None) and isinstance(inner.body, list) and len(_body(inner)) < len(inner.body):
            inner.body = _body(inner) or [ast.Pass()]
    return ast.dump(node).replace("'__file__'", repr(os.path.dirname(name)))


def _read_names(node):
    """The names `node`'s code reads."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _binding(tree, name, word, depth=0):
    """[(what, where, node)] of what the top-level statements of the module `name` of `tree` bind `word` to: the
    module an import names, or the code of the statement that defines it, found through the project's own
    imports (`where`: the file that holds it); [] for a name the module does not bind (a builtin, a local)."""
    module = _parse(tree, name)
    if depth >= 8 or module and any(alias.name == "*" for node in module.body if isinstance(node, ast.ImportFrom)
                                    for alias in node.names):
        # a star import binds names no one can read off the page, and a chain of 8 re-exports is not followed:
        # unknown, equal to nothing (so never the same meaning)
        return [(("unknown", object()), None, None)]
    found = []
    for node in module.body if module else ():
        if word not in _bound_names(node):
            continue
        if isinstance(node, ast.Import):
            found += [(("module", alias.name if alias.asname else word), None, None) for alias in node.names
                      if (alias.asname or alias.name.split(".")[0]) == word]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) != word:
                    continue
                home = (node.module or "").replace(".", "/") + ".py"
                if node.level == 0 and _read(os.path.join(tree, home)) is not None:
                    found += _binding(tree, home, alias.name, depth + 1)  # the project's own: what it holds there
                else:
                    found.append((("from", node.level, node.module, alias.name), None, None))
        else:
            found.append((("code", _code(node, name)), name, node))
    return found


def _same_meaning(old_tree, old_name, new_tree, new_name, words, seen):
    """Whether each of `words` is bound alike in the module `old_name` of `old_tree` and `new_name` of `new_tree`:
    the same imports, or definitions with the same code whose own names are bound alike, in turn."""
    for word in words:
        if (old_name, new_name, word) in seen:
            continue
        seen.add((old_name, new_name, word))
        old, new = _binding(old_tree, old_name, word), _binding(new_tree, new_name, word)
        if [what for what, _, _ in old] != [what for what, _, _ in new]:
            return False
        for (_, was, node), (_, now, _) in zip(old, new):
            if node is not None and not _same_meaning(old_tree, was, new_tree, now, _read_names(node), seen):
                return False
    return True


def moved_unchanged(old_tree, new_tree, name, lines):
    """The `lines` of the file `name` of `new_tree` that lie in top-level functions which moved there unchanged:
    a fingerprinted file of `old_tree` defined a function of that name with the same code (docstrings and
    comments aside), and every name it reads is bound alike in both modules (`_same_meaning`). Such a function
    computes what it computed before, so the check need not run it again. A class is never taken as moved (Keras
    saves a class by its module), nor a function that reads its module's name or globals (`KNOWS_ITS_MODULE`)."""
    new = _parse(new_tree, name)
    before = _parse(old_tree, name)
    if new is None:
        return set()
    stayed = {getattr(node, "name", None) for node in before.body} if before else set()
    olds = [(other, node) for other in sorted(numeric_files(old_tree)) if other.endswith(".py")
            for node in (_parse(old_tree, other) or ast.Module(body=[])).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    found = set()
    for node in new.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name in stayed:
            continue
        span = set(range(min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno + 1))
        words = _read_names(node)
        attributes = {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)} - {"__name__"}
        if not span & lines or (words | attributes) & KNOWS_ITS_MODULE or any(isinstance(n, ast.Global)
                                                                               for n in ast.walk(node)):
            continue
        code = _code(node, name)
        if any(old.name == node.name and _code(old, other) == code and
               _same_meaning(old_tree, other, new_tree, name, words - {node.name}, set()) for other, old in olds):
            found |= span
    return found & lines


def changed_lines(old, new):
    """The lines of `new` (numbers from 1) whose code differs from `old`'s, by a line diff of their
    statements (`rundir.code_lines`): each inserted or replaced line, and for a removed stretch the
    code line on either side of where it was, unless the stretch is whole top-level definitions that left
    the module (`_definitions_gone`: what replaces them elsewhere is a change of its own). A function's
    parameters are compared by their place, not their names (`_parameters_by_place`)."""
    a = [(n, line) for n, line in enumerate(rundir.code_lines(_parameters_by_place(old)), 1) if line]
    b = [(n, line) for n, line in enumerate(rundir.code_lines(_parameters_by_place(new)), 1) if line]
    found, removed = set(), []
    matcher = difflib.SequenceMatcher(None, [line for _, line in a], [line for _, line in b], autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            found.update(b[j][0] for j in range(j1, j2))
        elif tag == "delete":
            removed.append(({a[i][0] for i in range(i1, i2)}, [b[j][0] for j in (j1 - 1, j2) if 0 <= j < len(b)]))
    for lines, neighbours in removed:
        if not _definitions_gone(old, new, lines, found):
            found.update(neighbours)
    return found


READS_PARAMETER_NAMES = re.compile(r"argnames|\bsignature\(|getfullargspec|locals\(\)|__code__")  # not get_signature(


def _parameters_by_place(source):
    """`source` with the parameters of each function outside a class (and of each lambda) spelled by their place,
    `__arg_D_I` (parameter I of a function nested D deep), and so are the names that read them in its body.
    Renaming a parameter, and every use of it, is then no change. A name that reads another variable after
    the rename (one the new name captured, or a local of the same name in a nested function) still differs,
    and so does a call that passes it by keyword: a statement of its own. Methods keep their names, since
    Keras reads a layer's constructor arguments by name (`get_config`), and so does every function of a module
    that reads names of parameters itself (`READS_PARAMETER_NAMES`: inspect, jax's static_argnames, locals())."""
    if READS_PARAMETER_NAMES.search(source):
        return source
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    spans = []  # (line, byte offset, name, placeholder)

    def visit(node, scopes, in_class=False):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not in_class:
            arguments = node.args
            params = [*arguments.posonlyargs, *arguments.args, *filter(None, [arguments.vararg]),
                      *arguments.kwonlyargs, *filter(None, [arguments.kwarg])]
            outside = [*arguments.defaults, *filter(None, arguments.kw_defaults), *getattr(node, "decorator_list", []),
                       *filter(None, [getattr(node, "returns", None)]), *filter(None, (a.annotation for a in params))]
            for child in outside:  # evaluated where the function is defined
                visit(child, scopes)
            names = {param.arg: f"__arg_{len(scopes)}_{i}" for i, param in enumerate(params)}
            spans.extend((param.lineno, param.col_offset, param.arg, names[param.arg]) for param in params)
            for child in node.body if isinstance(node.body, list) else [node.body]:
                visit(child, [*scopes, names])
            return
        if isinstance(node, ast.Name):
            for names in reversed(scopes):
                if node.id in names:
                    spans.append((node.lineno, node.col_offset, node.id, names[node.id]))
                    break
        for child in ast.iter_child_nodes(node):
            visit(child, scopes, isinstance(node, ast.ClassDef))

    visit(tree, [])
    lines = [line.encode("utf-8") for line in source.splitlines(keepends=True)]
    for line, offset, name, placeholder in sorted(spans, reverse=True):  # right to left: offsets stay true
        text, name = lines[line - 1], name.encode("utf-8")
        if text[offset:offset + len(name)] != name:  # a position the parser got wrong: every name as it is
            return source
        lines[line - 1] = text[:offset] + placeholder.encode() + text[offset + len(name):]
    return b"".join(lines).decode("utf-8")


def _definitions_gone(old, new, lines, changed):
    """Whether the removed code `lines` of `old` are whole top-level functions or classes, each of whose names
    `new` binds at its top level only in changed statements (one with a line in `changed`: an import of it from
    its new home, say), or not at all. Removing such a definition changes nothing around it: only what its
    name stands for, which is then new code that must run in the check, or nothing (a NameError ends the run)."""
    try:
        before, after = ast.parse(old), ast.parse(new)
    except SyntaxError:
        return False
    spans = {node.name: set(range(min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno + 1))
             for node in before.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    gone = [name for name, span in spans.items() if span & lines]
    if not gone or not lines <= set().union(*(spans[name] for name in gone)):
        return False
    code = [n for n, line in enumerate(rundir.code_lines(old), 1) if line]
    if any(not spans[name] & set(code) <= lines for name in gone):
        return False  # part of a definition stays
    bound = {}
    for node in after.body:
        for name in _bound_names(node):
            bound.setdefault(name, []).append(set(range(node.lineno, node.end_lineno + 1)))
    return all(statement & changed for name in gone for statement in bound.get(name, []))


def _bound_names(node):
    """The names a top-level statement binds: a definition's, an import's, an assignment's targets."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(alias.asname or alias.name).split(".")[0] for alias in node.names]
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [t.id for target in targets for t in ast.walk(target) if isinstance(t, ast.Name)]
    return []


def statements(source):
    """[(first line, last line, node)] of every statement and except clause of `source` (a decorated
    definition starts at its first decorator)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.stmt, ast.excepthandler)):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            found.append((first, node.end_lineno, node))
    return found


def _body(node):
    """The statements of a block, less a docstring (which does not run)."""
    body = list(getattr(node, "body", []))
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def _header(first, node):
    """The lines of a statement that run with it: all of a simple statement, the header of a compound one."""
    children = [child for field in ("body", "orelse", "finalbody", "handlers") for child in getattr(node, field, [])]
    if not children:
        return range(first, node.end_lineno + 1)
    body = min(min([c.lineno] + [d.lineno for d in getattr(c, "decorator_list", [])]) for c in children)
    return range(first, max(body, first + 1))


def needs(source, line):
    """The lines of which at least one must have run for a change on `line` to be seen, or None for a
    change that cannot move a number: a `raise` ends the run it is in (the test that guards it is a
    statement of its own, and must run), and so does an except clause whose body is one `raise` (whatever
    it catches, the run ends there, as it would without it). A change to a definition's header (its name, arguments,
    defaults or decorators) is seen when its body runs; a change inside a compound statement's header,
    when that header runs; any other, when its statement runs."""
    around = sorted(((first, last, node) for first, last, node in statements(source) if first <= line <= last),
                    key=lambda item: (item[0], -item[1]))
    if not around:
        return ()
    first, last, node = around[-1]  # the innermost: the one that starts last (on one line: the deepest)
    if isinstance(node, ast.Raise):
        return None
    header = _header(first, node)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.excepthandler)) and line in header:
        body = _body(node)
        if isinstance(node, ast.excepthandler) and len(body) == 1 and isinstance(body[0], ast.Raise):
            return None
        return _header(body[0].lineno, body[0]) if body else header
    return header


def unexecuted(changed, tree, data):
    """[(file, line, text)] of the `changed` statements ({file: {line: text}} of `tree`) of which no line
    ran, by the coverage `data` (coverage.CoverageData)."""
    missed = []
    for name, lines in changed.items():
        path = os.path.realpath(os.path.join(tree, name))
        ran = set(data.lines(path) or ())
        with open(path, encoding="utf-8") as f:
            source = f.read()
        for line, text in lines.items():
            wanted = needs(source, line)
            if wanted is not None and not ran.intersection(wanted):
                missed.append((name, line, text))
    return missed


def coverage_rc(tree, work):
    """A coverage.py configuration measuring the fingerprinted Python files of `tree`, one data file per process,
    in every Python process a step starts too (`patch = subprocess`): a sweep's runs, which Ray starts
    (reproduction/worker.py), and the Ray workers that start them (`runner.save_coverage`)."""
    files = sorted(name for name in numeric_files(tree) if name.endswith(".py"))
    os.makedirs(os.path.join(work, "coverage"), exist_ok=True)
    path = os.path.join(work, "coveragerc")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"[run]\nparallel = True\npatch = subprocess\ndata_file = {os.path.join(work, 'coverage', 'data')}\n"
                "disable_warnings = no-data-collected, module-not-imported, module-not-measured\ninclude =\n"
                + "".join(f"    {os.path.realpath(os.path.join(tree, name))}\n" for name in files))
    return path


def coverage_data(work):
    """The check's coverage, every step's processes combined (coverage.CoverageData)."""
    measured = coverage.Coverage(data_file=os.path.join(work, "coverage", "data"))
    measured.combine([os.path.join(work, "coverage")], keep=True)
    return measured.get_data()
