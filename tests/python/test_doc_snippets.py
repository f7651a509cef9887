"""The Python snippets of README.md and docs/*.md name nothing they do not define or import.

A snippet is read by users who paste it: issue 44 found the Lightning snippet of
docs/integrations.md calling `lightning.pytorch.Trainer` without `import lightning` (NameError).
Every name a snippet reads must be a builtin, bound in it or in an earlier snippet of the same
page (pages read top down: import, assignment, def, loop, with, argument), or one of the
placeholders the prose supplies (the user's model, data, tensors). The snippets are parsed too,
so a syntax error fails here.
"""
import ast
import builtins
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
# what the prose around a snippet says the user has
PLACEHOLDERS = {
    "model", "module", "loader", "tensor", "out", "inp", "shard", "cfg", "ddp", "ddp_model", "x",
    "fsdp_model", "optimizer", "opt", "batch", "dataset", "args", "rank", "world", "group", "state",
    "config", "output", "input", "grads", "step", "loss", "writer", "accelerator", "trainer",
}


def _snippets():
    for page in PAGES:
        text = page.read_text()
        before = ""
        for m in re.finditer(r"```python\n(.*?)```", text, re.S):
            line = text[:m.start()].count("\n") + 2
            yield pytest.param(m.group(1), before, id=f"{page.name}:{line}")
            before += m.group(1) + "\n"


def _bound(code: str) -> set:
    return _names(code)[0]


def _unbound_names(code: str, before: str = "") -> set:
    bound, read = _names(code)
    return read - bound - _bound(before) - set(dir(builtins)) - PLACEHOLDERS


def _names(code: str):
    tree = ast.parse(code)
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return bound, read


@pytest.mark.parametrize("code,before", list(_snippets()))
def test_snippet_names_what_it_uses(code, before):
    unbound = _unbound_names(code, before)
    assert not unbound, f"the snippet reads names it neither imports nor defines: {sorted(unbound)}"


def test_the_check_catches_the_lightning_snippet_of_issue_44():
    broken = ("from lightning.pytorch.strategies import DDPStrategy\n"
              "trainer = lightning.pytorch.Trainer(strategy=DDPStrategy())\n")
    assert _unbound_names(broken) == {"lightning"}
