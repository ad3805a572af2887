"""What may import what (docs/design.md section 3), checked on the source: no import circle
between the product's modules (module-level or lazy imports alike), nothing in the
product importing benchmarks/, and each part's forbidden neighbours."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("planner", "executor", "api", "recycle")
FORBIDDEN = {"planner": {"torch", "fastapi", "starlette", "uvicorn", "executor", "api"},
             "api": {"torch", "executor"},
             "executor": {"fastapi", "starlette", "uvicorn", "api"}}


def _modules() -> dict:
    out = {}
    for part in PARTS:
        for dp, _, fs in os.walk(os.path.join(ROOT, part)):
            for f in fs:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dp, f), ROOT)[:-3].replace(os.sep, ".")
                    out[rel.removesuffix(".__init__")] = os.path.join(dp, f)
    return out


def _imports(mod: str, path: str) -> set:
    """Every module name `path` imports, anywhere in it (relative ones resolved)."""
    pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{a.name}" for a in node.names)
    return names


def _graph():
    mods = _modules()
    graph, raw = {}, {}
    for mod, path in mods.items():
        raw[mod] = _imports(mod, path)
        edges = set()
        for name in raw[mod]:
            while name and name not in mods:
                name = name.rpartition(".")[0]
            if name and name != mod and not mods[name].endswith("__init__.py"):
                edges.add(name)
        graph[mod] = edges
    return graph, raw


def _cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = n[0]; n[0] += 1; stack.append(root); on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = n[0]; n[0] += 1; stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop(); on.discard(w); comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle_in_the_product():
    graph, _ = _graph()
    assert _cycles(graph) == []


def test_the_circle_finder_finds_one():  # the check above can fail
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_product_never_imports_benchmarks_and_parts_keep_their_rules():
    _, raw = _graph()
    bad = []
    for mod, names in raw.items():
        tops = {n.split(".")[0] for n in names}
        if "benchmarks" in tops:
            bad.append(f"{mod} imports benchmarks")
        for name in tops & FORBIDDEN.get(mod.split(".")[0], set()):
            bad.append(f"{mod} imports {name}")
    assert bad == []


def test_only_the_cli_package_imports_the_cli_libraries():
    """typer (and click under it) in recycle/ only: planner/, executor/ and api/ expose
    plain functions, and raise planner/errors.py's typed errors for the CLI to report."""
    _, raw = _graph()
    bad = sorted(f"{mod} imports {name}" for mod, names in raw.items()
                 if mod.split(".")[0] != "recycle"
                 for name in {n.split(".")[0] for n in names} & {"typer", "click"})
    assert bad == []
