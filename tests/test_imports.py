"""The import graph: entry points sit on top (nothing imports one, train.py included),
and no modules import each other in a circle. Read from the source of every product .py file."""
import ast
import glob
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def module_name(path):
    return os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")


def product_files():
    files = glob.glob(os.path.join(REPO, "*.py")) + glob.glob(os.path.join(REPO, "*", "*.py")) \
        + glob.glob(os.path.join(REPO, "*", "*", "*.py"))
    return {module_name(p): p for p in files if os.path.relpath(p, REPO).split(os.sep)[0] not in ("tests", "config", "suites")}


def is_entry_point(path):
    """A file with `if __name__ == "__main__":` at top level."""
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
                getattr(node.test.left, "id", None) == "__name__":
            return True
    return False


def imports(path, modules):
    """The repository modules a file imports, anywhere in it (a function's own imports count)."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {name for name in names if name in modules}
    return found


def graph():
    modules = product_files()
    return modules, {name: imports(path, modules) for name, path in modules.items()}


def test_the_import_rules_hold_on_made_up_modules(tmp_path):
    """The checks themselves find what they look for."""
    (tmp_path / "a.py").write_text("import b\n\nif __name__ == '__main__':\n    pass\n")
    (tmp_path / "b.py").write_text("def f():\n    from c import g\n")
    (tmp_path / "c.py").write_text("import b\n")
    modules = {"a": str(tmp_path / "a.py"), "b": str(tmp_path / "b.py"), "c": str(tmp_path / "c.py")}
    edges = {name: imports(path, modules) for name, path in modules.items()}
    assert edges == {"a": {"b"}, "b": {"c"}, "c": {"b"}}
    assert [is_entry_point(p) for p in modules.values()] == [True, False, False]
    assert circles(edges) == [["b", "c"]]


def test_no_entry_point_is_imported():
    modules, edges = graph()
    entry_points = {name for name, path in modules.items() if is_entry_point(path)}
    assert {"train", "sweep", "report", "eval", "hellaswag", "sample", "export_checkpoint", "tools.bench_ra_kernels"} <= entry_points
    offending = sorted(f"{importer} imports {imported}" for importer, targets in edges.items()
                       for imported in targets & entry_points)
    assert offending == []


def circles(edges):
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in edges.get(v, ()):
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    _, edges = graph()
    assert circles(edges) == []


def reachable(edges, start):
    seen, todo = set(), [start]
    while todo:
        for w in edges.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_comparison_engine_stands_on_run_directories_alone():
    """ablation/ reads finished run directories: it imports, directly or not, only rundir,
    configurator and itself, so a report never loads the models or the training stack."""
    modules, edges = graph()
    for name in modules:
        if name.startswith("ablation.") or name == "report":
            below = {m for m in reachable(edges, name) if not m.startswith("ablation")}
            assert below <= {"rundir", "configurator"}, (name, below)


def test_the_engine_and_report_py_import_no_torch():
    """Importing the engine, or report.py, loads neither torch nor a model file (a fresh process)."""
    import subprocess
    import sys
    code = ("import sys; import report, ablation.compare, ablation.suites, ablation.plan, ablation.render; "
            "print(sorted(m for m in ('torch', 'runtime', 'model', 'ra_model', 'reduced_sync_model') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_top_level_holds_scripts_and_the_modules_they_read():
    """A newcomer sees what to run at the top: scripts, the models and the training library, nothing else."""
    top = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "*.py")))
    assert len(top) <= 26, top
    assert not [name for name in top if name.startswith("bench") or name in ("noise_budget", "calibration")]


def test_kernels_import_no_model():
    """kernels/ holds kernels and their checks and imports no model; a benchmark that runs them
    inside a model lives outside kernels/."""
    _, edges = graph()
    outside = {f"{name} imports {imported}" for name, targets in edges.items() if name.startswith("kernels.")
               for imported in targets if not imported.startswith("kernels.") and imported != "configurator"}
    assert outside == set()
