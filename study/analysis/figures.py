"""The study's figures (docs/img): drawn from the shipped results by one command, with the hash of their inputs.

`render` draws each figure of FIGURES with the report's plotting functions (study/analysis/plots.py) from the files it lists (paths
relative to the repository root) and writes beside it `<name>.png.inputs.json`:
  {"command": the command that redraws it, "inputs": {path: sha256 of the file}, "image_sha256": sha256 of the PNG}
Images and sidecars are written beside their final names and renamed over them, after every figure is drawn, so a
failure leaves the old ones in place. `stale` compares a directory's images and sidecars with the files on disk
(tests/test_figures.py runs it on docs/img): a changed, missing or re-listed input, a missing sidecar or an image
replaced by hand makes that figure stale, and the message names the command to rerun.
"""

from __future__ import annotations

import glob
import json
import os

from opd_jax.errors import InputError
from opd_jax.experiments.files import file_hash, read_budget, write_json
from study.analysis import plots

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS_DIR = "docs/img"  # where docs/study.md shows them from
COMMAND = "python -m study.report --figures="  # + the output directory
SIDECAR = ".inputs.json"  # appended to the image's file name

# Every shipped sweep run the figures draw; a later file's run of the same configuration and seed wins.
RESULTS = (
    "results/sources.jsonl", "results/noise_75.jsonl", "results/staleness_lr4.jsonl",
    "results/boundary_pair1_seed0.jsonl", "results/boundary_pair1_seed1.jsonl", "results/boundary_pair1_seed2.jsonl",
    "results/boundary_pair3_seed0.jsonl", "results/boundary_pair3_seed1.jsonl", "results/boundary_pair3_seed2.jsonl",
    "results/recipes_seed0.jsonl", "results/recipes_seed1.jsonl", "results/recipes_seed2.jsonl",
    "results/sources_pair3_seed1.jsonl", "results/sources_pair3_seed2.jsonl", "results/smollm2/recipes.jsonl",
)
BUDGET = "results/budget.json"  # its pooled budget is the dashed line
FIGURES = {  # image file name -> the files it is drawn from
    "quality_vs_mismatch.png": RESULTS + (BUDGET,),
    "mismatch_sources.png": RESULTS,
}


def command_for(out: str, root: str = ROOT) -> str:
  """The command that redraws the figures into `out` (relative to the root when inside it)."""
  out = os.path.abspath(out)
  inside = os.path.commonpath([out, os.path.abspath(root)]) == os.path.abspath(root)
  return COMMAND + (os.path.relpath(out, root) if inside else out)


def _drawings(root: str) -> dict:
  """Figure name -> a function drawing it to a path, every input read and checked up front."""
  rows = plots.load_rows([os.path.join(root, p) for p in RESULTS])
  budget = read_budget(os.path.join(root, BUDGET))
  return {"quality_vs_mismatch.png": lambda path: plots.plot_quality_vs_mismatch(rows, budget, path),
          "mismatch_sources.png": lambda path: plots.plot_sources(rows, path)}


def render(out: str, root: str = ROOT) -> list[str]:
  """Draws every figure of FIGURES into `out` with its sidecar; returns the image paths."""
  inputs = sorted({p for of_figure in FIGURES.values() for p in of_figure})
  missing = [p for p in inputs if not os.path.isfile(os.path.join(root, p))]
  if missing:
    raise InputError(f"the figures' inputs {missing} are missing under {root!r}; the figures draw the shipped "
                     "results/ files listed in study/analysis/figures.py")
  if os.path.exists(out) and not os.path.isdir(out):
    raise InputError(f"--figures {out!r} is a file; give a directory for the images")
  hashes = {p: file_hash(os.path.join(root, p)) for p in inputs}  # before reading: a later edit shows as stale
  drawings = _drawings(root)
  os.makedirs(out, exist_ok=True)
  command, tmps, sidecars = command_for(out, root), {}, {}
  try:
    for name, of_figure in FIGURES.items():
      tmps[name] = os.path.join(out, name + ".tmp")
      drawings[name](tmps[name])
      sidecars[name] = {"command": command, "inputs": {p: hashes[p] for p in of_figure},
                        "image_sha256": file_hash(tmps[name])}
  except BaseException:
    for tmp in tmps.values():
      if os.path.exists(tmp):
        os.remove(tmp)
    raise
  paths = []
  for name, tmp in tmps.items():  # every figure is drawn: only renames are left
    path = os.path.join(out, name)
    os.replace(tmp, path)
    write_json(path + SIDECAR, sidecars[name])
    paths.append(path)
  return paths


def stale(img_dir: str, root: str = ROOT, expected: dict | None = None) -> list[str]:
  """One message per stale figure in img_dir (none when every image is what its sidecar's command draws from
  today's files); `expected` (default FIGURES) names the figures and inputs that must be there."""
  expected = FIGURES if expected is None else expected
  default_command = command_for(img_dir, root)
  out = []
  names = sorted({os.path.basename(p) for p in glob.glob(os.path.join(img_dir, "*.png"))} | set(expected))
  for name in names:
    image, sidecar_path = os.path.join(img_dir, name), os.path.join(img_dir, name + SIDECAR)
    shown = os.path.relpath(image, root)
    if not os.path.isfile(sidecar_path):
      out.append(f"{shown} is stale: no sidecar {os.path.basename(sidecar_path)}; redraw it with: {default_command}")
      continue
    try:
      with open(sidecar_path) as f:
        sidecar = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      out.append(f"{shown} is stale: its sidecar cannot be read ({e}); redraw it with: {default_command}")
      continue
    command = sidecar.get("command", default_command)
    reasons = []
    if not os.path.isfile(image):
      reasons.append("the image is missing")
    elif file_hash(image) != sidecar.get("image_sha256"):
      reasons.append("the image is not the one its sidecar records (edited or drawn by hand)")
    for path, digest in sorted(sidecar.get("inputs", {}).items()):
      if not os.path.isfile(os.path.join(root, path)):
        reasons.append(f"input {path} no longer exists")
      elif file_hash(os.path.join(root, path)) != digest:
        reasons.append(f"input {path} changed since it was drawn")
    if name in expected and set(sidecar.get("inputs", {})) != set(expected[name]):
      reasons.append("it was drawn from other files than study/analysis/figures.py lists")
    if reasons:
      out.append(f"{shown} is stale: {'; '.join(reasons)}; redraw it with: {command}")
  return out
