"""Recovery is lowered, not bolted on: only the worker loop (executor/runtime/worker_loop.py)
holds the WorkerLoop; entering a version, syncing and reshaping state, replaying a lost stage
and one iteration all take the typed StageHandle (executor/runtime/stage_handle.py)."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "executor"
LOOP = RUNTIME / "runtime" / "worker_loop.py"


def _modules():
    for path in sorted(RUNTIME.rglob("*.py")):
        if path != LOOP and "node" not in path.relative_to(RUNTIME).parts[:1]:
            yield path, ast.parse(path.read_text())


def test_no_module_but_the_loop_takes_or_reaches_into_the_agent():
    offenders = []
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [a.arg for a in node.args.args + node.args.kwonlyargs]
                if "agent" in names:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} takes `agent`")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "agent":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} agent.{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module == "executor.runtime.worker_loop" \
                    and path.name != "worker.py":  # the process's entry point builds it
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} imports the WorkerLoop")
    assert not offenders, "\n".join(offenders)


def test_the_worker_loop_stays_small():
    assert len(LOOP.read_text().splitlines()) <= 250
