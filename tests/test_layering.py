"""Imports only run downward, so importing the learner never pulls in the tools that drive it: inside opd_jax by
layer, and from launch/ (the commands) into the package, never back."""

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "opd_jax")
# Lowest first; a module may import its own package and any package of a lower layer.
LAYERS = [{"errors"}, {"models"}, {"data"}, {"rollout", "objectives"}, {"mismatch", "prepare", "serving"}, {"train"},
          {"screening"}, {"planning"}, {"experiments"}, {"bench"}]


def _layer(package: str) -> int:
  return next(i for i, names in enumerate(LAYERS) if package in names)


def _imports(path: str) -> list[str]:
  """Every module path imported by the file, in both forms (`from a.b import c` -> a.b.c and a.b;
  `import a.b` -> a.b), also the imports inside functions."""
  with open(path) as f:
    tree = ast.parse(f.read())
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      out += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    elif isinstance(node, ast.Import):
      out += [alias.name for alias in node.names]
  return out


def _python_files(root: str):
  for folder, _, files in os.walk(root):
    for name in sorted(files):
      if name.endswith(".py"):
        yield os.path.join(folder, name)


def test_imports_only_run_downward():
  upward = []
  for path in _python_files(PACKAGE):
    rel = os.path.relpath(path, PACKAGE)
    if os.sep not in rel:
      continue  # opd_jax/__init__.py, opd_jax/errors.py
    package = rel.split(os.sep)[0]
    for module in _imports(path):
      parts = module.split(".")
      if parts[0] == "launch":
        upward.append(f"{rel} imports {module} (the package never imports the commands)")
      elif parts[0] == "opd_jax" and len(parts) > 1 and parts[1] in set().union(*LAYERS):
        if parts[1] != package and _layer(parts[1]) > _layer(package):
          upward.append(f"{rel} imports {module}")
  assert {d for d in os.listdir(PACKAGE) if os.path.isdir(os.path.join(PACKAGE, d)) and d not in (
      "assets", "__pycache__")} | {"errors"} == set().union(*LAYERS)
  assert not upward, upward


def test_the_commands_import_the_package_and_their_shared_helpers_only():
  """A launch script imports opd_jax, configs and launch._cli; never another command (each stays thin, and what
  two commands share lives in the package)."""
  wrong = []
  for path in _python_files(os.path.join(REPO, "launch")):
    for module in _imports(path):
      if module.startswith("launch") and module not in ("launch", "launch._cli"):
        wrong.append(f"{os.path.relpath(path, REPO)} imports {module}")
  assert not wrong, wrong


def test_the_checker_sees_both_import_forms(tmp_path):
  """The checker itself: `import opd_jax.x.y` and `from opd_jax.x import y` both count."""
  path = tmp_path / "m.py"
  path.write_text("import opd_jax.train.loop\nfrom opd_jax.bench import models\ndef f():\n  import launch._cli\n")
  assert {"opd_jax.train.loop", "opd_jax.bench", "opd_jax.bench.models", "launch._cli"} <= set(_imports(str(path)))
