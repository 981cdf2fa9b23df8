"""Set-up: README's commands and .ci/run install the locked versions of constraints.txt."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STACK = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "aqtp", "transformers", "grain", "tensorstore",
         "torch", "numpy", "ml-collections")


def _read(name):
  with open(os.path.join(ROOT, name)) as f:
    return f.read()


def test_constraints_pin_every_package_of_the_stack_exactly():
  pins = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)$", _read("constraints.txt"), flags=re.M))
  pins = {name.lower().replace("_", "-"): version for name, version in pins.items()}
  assert all(name in pins for name in STACK), [name for name in STACK if name not in pins]
  assert pins["torch"] == "2.13.0"  # the CPU build (its +cpu label matches); a plain torch pulls CUDA


def test_readme_and_ci_install_with_the_constraints():
  readme, ci = _read("README.md"), _read(".ci/run")
  commands = [line for line in readme.splitlines()[:30] if line.startswith("python3 -m venv")]
  assert len(commands) >= 2 and all("-c constraints.txt" in c for c in commands), commands
  test_command = next(c for c in commands if "pytest" in c)
  assert test_command.replace("pip install -e", "pip install -q -e") in ci  # .ci/run runs README's command


def test_every_relative_link_in_the_readme_and_docs_points_at_a_file():
  """README.md and docs/*.md link to each other and to the repository's files; a moved file breaks no link."""
  pages = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                           if f.endswith(".md")]
  broken = []
  for page in pages:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _read(page)):
      if "://" not in target and not os.path.exists(os.path.join(ROOT, os.path.dirname(page), target)):
        broken.append(f"{page} -> {target}")
  assert len(pages) >= 10 and not broken, broken
