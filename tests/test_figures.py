"""The study's figures (docs/img) are what `python -m study.report --figures=docs/img` draws from today's
results/ files: each image has a sidecar with the sha256 of every input, and the check reports a figure whose
inputs changed since it was drawn."""

import glob
import json
import os
import shutil

import pytest

from study.analysis import figures
from study.analysis import plots
from opd_jax.experiments.files import file_hash, read_budget

ROOT = figures.ROOT
DOCS_IMG = os.path.join(ROOT, figures.DOCS_DIR)
DOCS_COMMAND = figures.COMMAND + figures.DOCS_DIR


def test_the_docs_figures_are_drawn_from_todays_results():
  """Every docs/img image has a sidecar whose inputs exist and hash as listed: no figure is stale."""
  images = sorted(os.path.basename(p) for p in glob.glob(os.path.join(DOCS_IMG, "*.png")))
  assert images == sorted(figures.FIGURES)
  for name in images:
    with open(os.path.join(DOCS_IMG, name + figures.SIDECAR)) as f:
      sidecar = json.load(f)
    assert sidecar["command"] == DOCS_COMMAND
    assert set(sidecar["inputs"]) == set(figures.FIGURES[name])
  stale = figures.stale(DOCS_IMG)
  assert stale == [], "\n".join(stale)


def _copy_of_the_docs_figures(root) -> str:
  """tmp root holding docs/img and every input its sidecars list; returns its docs/img."""
  img = root / figures.DOCS_DIR
  shutil.copytree(DOCS_IMG, img)
  for path in sorted({p for inputs in figures.FIGURES.values() for p in inputs}):
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(os.path.join(ROOT, path), root / path)
  return str(img)


def test_a_changed_input_makes_its_figure_stale(tmp_path):
  """On a copy: editing budget.json makes only the figure drawn from it stale, a results file both; the message
  names the input and the command to rerun. A missing sidecar or an image edited by hand is stale too."""
  img = _copy_of_the_docs_figures(tmp_path)
  assert figures.stale(img, root=str(tmp_path)) == []
  with open(tmp_path / figures.BUDGET, "a") as f:
    f.write("\n")
  stale = figures.stale(img, root=str(tmp_path))
  assert len(stale) == 1 and stale[0].startswith("docs/img/quality_vs_mismatch.png is stale")
  assert f"input {figures.BUDGET} changed" in stale[0] and stale[0].endswith(f"redraw it with: {DOCS_COMMAND}")
  with open(tmp_path / figures.RESULTS[0], "a") as f:
    f.write("\n")
  stale = figures.stale(img, root=str(tmp_path))
  assert [m.split(" ")[0] for m in stale] == ["docs/img/mismatch_sources.png", "docs/img/quality_vs_mismatch.png"]
  assert all(f"input {figures.RESULTS[0]} changed" in m and DOCS_COMMAND in m for m in stale)
  os.remove(os.path.join(img, "mismatch_sources.png" + figures.SIDECAR))
  with open(os.path.join(img, "quality_vs_mismatch.png"), "ab") as f:
    f.write(b"\0")
  stale = figures.stale(img, root=str(tmp_path))
  assert "no sidecar" in stale[0] and "not the one its sidecar records" in stale[1]


def test_render_draws_both_figures_with_sidecars_and_a_real_pair_panel(tmp_path, monkeypatch):
  """render() into tmp: both images and sidecars, none stale; the quality figure has the real pair on a panel of
  its own and the budget line at budget.json's pooled budget. A failure while drawing leaves the earlier files
  as they were and no temporary file."""
  drawn, save = {}, plots._save
  monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.setdefault(os.path.basename(path), fig) and
                      save(fig, path))
  out = tmp_path / "img"
  paths = figures.render(str(out))
  assert sorted(os.listdir(out)) == sorted(n + s for n in figures.FIGURES for s in ("", figures.SIDECAR))
  assert paths == [str(out / n) for n in figures.FIGURES]
  assert figures.stale(str(out)) == []
  with open(out / ("mismatch_sources.png" + figures.SIDECAR)) as f:
    assert json.load(f)["command"] == figures.COMMAND + str(out)  # outside the repository: an absolute path
  axes = drawn["quality_vs_mismatch.png.tmp"].axes
  assert [ax.get_title() for ax in axes] == ["embedded pairs: arithmetic accuracy",
                                             "real pair smollm2: capitals accuracy"]
  pooled = read_budget(os.path.join(ROOT, figures.BUDGET))["budgets"]["pooled"]["budget"]
  for ax in axes:
    assert any(list(line.get_xdata()) == [pooled, pooled] for line in ax.get_lines())
  assert "95% t-interval" in drawn["quality_vs_mismatch.png.tmp"].get_suptitle()

  before = {name: file_hash(out / name) for name in os.listdir(out)}
  monkeypatch.setattr(plots, "plot_sources", lambda rows, path: 1 / 0)
  with pytest.raises(ZeroDivisionError):
    figures.render(str(out))
  assert {name: file_hash(out / name) for name in os.listdir(out)} == before


def test_the_real_pairs_drawn_apart_are_the_sweep_configs_real_pairs():
  from configs.sweeps import common
  assert set(plots.REAL_PAIR_QUALITY) == set(common.REAL_PAIRS)
