"""The product never imports benchmarks/peers or torchft (an optional extra for
benchmarks/peers only), and `tokenizers` only inside `data prepare --tokenizer`."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PRODUCT = ("planner", "executor", "api", "recycle")


def imports():
    for part in PRODUCT:
        for root, _, files in os.walk(os.path.join(ROOT, part)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(root, f)
                    tree = ast.parse(open(path).read(), path)
                    for node in ast.walk(tree):
                        if isinstance(node, ast.Import):
                            names = [a.name for a in node.names]
                        elif isinstance(node, ast.ImportFrom) and node.level == 0:
                            names = [node.module or ""]
                        else:
                            continue
                        for n in names:
                            yield os.path.relpath(path, ROOT), n, node


def test_product_imports_neither_the_peers_benchmark_nor_torchft():
    bad = [(p, n) for p, n, _ in imports()
           if n.split(".")[0] == "torchft" or n.startswith("benchmarks.peers")]
    assert not bad, bad


def test_tokenizers_only_lazily_in_the_tokenizer_module():
    found = [(p, node) for p, n, node in imports() if n.split(".")[0] == "tokenizers"]
    assert found and all(p == os.path.join("executor", "data", "tokenizer.py")
                         and node.col_offset > 0 for p, node in found), found  # in a function
