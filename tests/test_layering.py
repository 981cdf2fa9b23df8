"""Imports inside opd_jax only run downward, so importing the learner never pulls in the tools that drive it."""

import ast
import os

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "opd_jax")
# Lowest first; a module may import its own package and any package of a lower layer.
LAYERS = [{"errors"}, {"models"}, {"data"}, {"rollout", "objectives"}, {"mismatch", "prepare"}, {"train"},
          {"screening"}, {"analysis"}]


def _layer(package: str) -> int:
  return next(i for i, names in enumerate(LAYERS) if package in names)


def test_imports_only_run_downward():
  upward = []
  for root, _, files in os.walk(PACKAGE):
    for name in files:
      if not name.endswith(".py") or os.path.relpath(root, PACKAGE) == ".":
        continue
      package = os.path.relpath(root, PACKAGE).split(os.sep)[0]
      path = os.path.join(root, name)
      with open(path) as f:
        tree = ast.parse(f.read())
      for node in ast.walk(tree):  # also the imports inside functions
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("opd_jax."):
          target = node.module.split(".")[1]
          if target != package and _layer(target) > _layer(package):
            upward.append(f"{os.path.relpath(path, PACKAGE)} imports opd_jax.{target}")
  assert {d for d in os.listdir(PACKAGE) if os.path.isdir(os.path.join(PACKAGE, d)) and d not in (
      "assets", "__pycache__")} | {"errors"} == set().union(*LAYERS)
  assert not upward, upward
