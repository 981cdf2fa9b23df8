"""Imports only run downward, so importing the learner never pulls in the tools that drive it: inside opd_jax by
layer, from launch/ (the commands) into the package, and from study/ (not installed) into both, never back."""

import ast
import os
import tomllib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(REPO, "opd_jax")
# Lowest first; a module may import its own package and any package of a lower layer.
LAYERS = [{"errors"}, {"models", "cluster"}, {"data"}, {"rollout", "objectives"},
          {"mismatch", "prepare", "serving", "crosstok"}, {"spec"}, {"train"}, {"screening"}, {"planning"},
          {"experiments"}, {"bench"}]


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
      if parts[0] in ("launch", "study"):
        upward.append(f"{rel} imports {module} (the package never imports the commands or the study)")
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


def test_the_study_is_outside_the_product():
  """study/ uses opd_jax, configs and launch._cli as a user's script would; nothing installed (opd_jax, configs,
  launch) imports study, and study is not among the packages pyproject.toml installs."""
  wrong = []
  for root in ("opd_jax", "configs", "launch"):
    for path in _python_files(os.path.join(REPO, root)):
      wrong += [f"{os.path.relpath(path, REPO)} imports {m}" for m in _imports(path) if m.split(".")[0] == "study"]
  for path in _python_files(os.path.join(REPO, "study")):
    wrong += [f"{os.path.relpath(path, REPO)} imports {m}" for m in _imports(path)
              if m.startswith("launch") and m not in ("launch", "launch._cli")]
  assert not wrong, wrong
  with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
    installed = tomllib.load(f)["tool"]["setuptools"]["packages"]["find"]["include"]
  assert not [p for p in installed if p.startswith("study")], installed


def test_the_checker_sees_both_import_forms(tmp_path):
  """The checker itself: `import opd_jax.x.y` and `from opd_jax.x import y` both count."""
  path = tmp_path / "m.py"
  path.write_text("import opd_jax.train.loop\nfrom opd_jax.bench import models\ndef f():\n  import launch._cli\n")
  assert {"opd_jax.train.loop", "opd_jax.bench", "opd_jax.bench.models", "launch._cli"} <= set(_imports(str(path)))


def _module_graph(root: str) -> dict[str, set[str]]:
  """opd_jax module -> the opd_jax modules it imports (at the top or inside functions), as dotted names:
  `from pkg import mod` counts as the module mod, `from pkg import name` and `import pkg` as the package."""
  files = {}
  for path in _python_files(root):
    rel = os.path.relpath(path, os.path.dirname(root))[:-len(".py")].replace(os.sep, ".")
    files[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = path
  graph = {}
  for name, path in files.items():
    with open(path) as f:
      tree = ast.parse(f.read())
    edges = set()
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        for alias in node.names:
          edges.add(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in files else node.module)
      elif isinstance(node, ast.Import):
        edges.update(alias.name for alias in node.names)
    graph[name] = {m for m in edges if m in files and m != name}
  return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """One cycle per strongly connected component with more than one module (Tarjan's algorithm)."""
  index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

  def visit(node):
    index[node] = low[node] = counter[0]
    counter[0] += 1
    stack.append(node)
    on_stack.add(node)
    for nxt in sorted(graph.get(node, ())):
      if nxt not in index:
        visit(nxt)
        low[node] = min(low[node], low[nxt])
      elif nxt in on_stack:
        low[node] = min(low[node], index[nxt])
    if low[node] == index[node]:
      component = []
      while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == node:
          break
      if len(component) > 1:
        out.append(sorted(component))

  for node in sorted(graph):
    if node not in index:
      visit(node)
  return out


def test_no_import_cycle_inside_the_package_or_the_study():
  """No two opd_jax (or study) modules import each other, directly or around a loop, not even from inside a
  function (a function-level import hides a cycle from Python, not from the design)."""
  for root in (PACKAGE, os.path.join(REPO, "study")):
    cycles = _cycles(_module_graph(root))
    assert not cycles, cycles


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function(tmp_path):
  package = tmp_path / "opd_jax"
  (package / "experiments").mkdir(parents=True)
  (package / "__init__.py").write_text("")
  (package / "experiments" / "__init__.py").write_text("")
  (package / "experiments" / "a.py").write_text("from opd_jax.experiments import b\n")
  (package / "experiments" / "b.py").write_text("def f():\n  from opd_jax.experiments import a\n")
  (package / "experiments" / "c.py").write_text("from opd_jax.experiments import a\n")
  assert _cycles(_module_graph(str(package))) == [["opd_jax.experiments.a", "opd_jax.experiments.b"]]


def test_no_config_dict_below_the_entry_points():
  """The training, planning and screening packages work on a RunSpec (opd_jax/spec; the planner on a PlanSpec
  that holds one): only the training entry point, `loop.train`, accepts a config (and turns it into a spec at
  once), and `export.read_run_pair` reads a finished run's stored config.json into its pair; nothing else there
  takes a `config`, builds a part from one or imports ml_collections (the commands make the specs: plan_memory,
  admit, sensitivity, with opd_jax.spec.screening_spec for a screen)."""
  boundary = {("loop.py", "train"), ("export.py", "read_run_pair")}
  found = []
  for path in [p for package in ("train", "planning", "screening") for p in _python_files(os.path.join(PACKAGE, package))]:
    name, rel = os.path.basename(path), os.path.relpath(path, PACKAGE)
    with open(path) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (name, node.name) in boundary:
        continue
      if "config" in [a.arg for a in node.args.args + node.args.kwonlyargs]:
        found.append(f"{rel}: {node.name}(config)")
      found += [f"{rel}: {node.name} calls .from_config" for call in ast.walk(node) if isinstance(
          call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "from_config"]
    found += [f"{rel} imports {m}" for m in _imports(path) if m.split(".")[0] == "ml_collections"]
  assert not found, found


# Modules past LONG_MODULE lines, each with the reason and what will shrink it (none today).
LONG_MODULES: dict[str, str] = {}
LONG_MODULE, LONG_FUNCTION = 400, 80


def test_modules_and_functions_stay_short():
  """No module of opd_jax or study over LONG_MODULE lines but those listed with a reason, and no function over
  LONG_FUNCTION lines unless its docstring says why ("Long because ...")."""
  found = []
  for path in [*_python_files(PACKAGE), *_python_files(os.path.join(REPO, "study"))]:
    rel = os.path.relpath(path, PACKAGE if path.startswith(PACKAGE + os.sep) else REPO)
    with open(path) as f:
      source = f.read()
    if source.count("\n") > LONG_MODULE and rel.replace(os.sep, "/") not in LONG_MODULES:
      found.append(f"{rel}: {source.count(chr(10))} lines")
    for node in ast.walk(ast.parse(source)):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
          node.end_lineno - node.lineno + 1 > LONG_FUNCTION and "Long because" not in (ast.get_docstring(node) or "")):
        found.append(f"{rel}: {node.name} is {node.end_lineno - node.lineno + 1} lines")
  assert not found, found


def test_nothing_edits_sys_path():
  """The package, the configs and the commands import each other as installed packages (pyproject.toml installs
  configs/ and launch/ beside opd_jax), never by editing sys.path."""
  found = []
  for root in ("opd_jax", "configs", "launch", "study"):
    for path in _python_files(os.path.join(REPO, root)):
      with open(path) as f:
        tree = ast.parse(f.read())
      found += [f"{os.path.relpath(path, REPO)}:{node.lineno}" for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                and node.value.id == "sys"]
  assert not found, found
