"""Corrected boundaries (cross_tokenizer.boundaries="corrected", opd_jax/crosstok/cover.py): covers are the tokens
whose text starts with a token's; every shared boundary ends a span, and each side's span log-prob plus its cover
corrections is a character-level log-prob, so a student that states the teacher's text distribution has zero
advantage on every span, also where the two tokenizations mean different events at a boundary."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opd_jax.crosstok.align import UNSCORED
from opd_jax.crosstok.cover import NONE, CoverTable
from opd_jax.crosstok.view import CrossTokenizerView, special_ids
from opd_jax.data.char_tokenizer import build_char_tokenizer
from opd_jax.data.number_tokenizer import build_number_tokenizer
from opd_jax.data.token_texts import token_texts
from opd_jax.models import load_tokenizer
from opd_jax.objectives.spans import cover_delta, span_corrections


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
  root = tmp_path_factory.mktemp("tokenizers")
  build_char_tokenizer(str(root / "char"))
  build_number_tokenizer(str(root / "number"))
  return {"char": load_tokenizer(str(root / "char")), "number": load_tokenizer(str(root / "number"))}


def _covers(student, teacher):
  return (CoverTable(student, len(student), special_ids(student) | {student.eos_token_id}),
          CoverTable(teacher, len(teacher), special_ids(teacher)))


def _view(student, teacher, corrected=True):
  return CrossTokenizerView(student, teacher, "plain", ["1+2="], (student.eos_token_id,), max_prompt=16,
                            max_response=16, covers=_covers(student, teacher) if corrected else None)


def _row(view, text, eos=True):
  ids = view.student.encode(text, add_special_tokens=False) + ([view.student.eos_token_id] if eos else [])
  response = np.zeros((1, 16), np.int32)
  response[0, :len(ids)] = ids
  return view.build(np.zeros(1, np.int64), response, (np.arange(16) < len(ids)).astype(np.float32)[None])


def test_a_cover_is_every_token_whose_text_starts_with_the_tokens(tokenizers):
  number = tokenizers["number"]
  table = CoverTable(number, len(number) + 3, special_ids(number))
  texts = token_texts(number)
  ranked = {int(r): i for i, r in enumerate(table.rank_V) if r >= 0}
  assert (table.rank_V[len(number):] == -1).all() and all(table.rank_V[i] == -1 for i in special_ids(number))
  for token, text in enumerate(texts):
    lo, hi = table.cover(token)
    if table.rank_V[token] < 0:
      assert (lo, hi) == NONE
      continue
    assert lo <= table.rank_V[token] < hi
    assert sorted(ranked[r] for r in range(lo, hi)) == sorted(
        i for i, t in enumerate(texts) if table.rank_V[i] >= 0 and t.startswith(text))
  one = number.convert_tokens_to_ids("1")
  lo, hi = table.cover(one)
  assert hi - lo == 11  # "1" and "10".."19"


def test_cover_delta_and_span_corrections_against_numpy():
  rng = np.random.RandomState(0)
  logp = jax.nn.log_softmax(jnp.asarray(rng.randn(2, 3, 6), jnp.float32), axis=-1)
  rank = jnp.asarray([3, -1, 0, 1, 2, 4], jnp.int32)  # token 1 is in no cover
  tokens = jnp.asarray([[2, 3, 0], [5, 4, 2]], jnp.int32)
  cover = jnp.asarray([[[0, 2], [-1, -1], [3, 5]], [[4, 5], [-1, -1], [0, 5]]], jnp.int32)
  delta = np.asarray(cover_delta(logp, tokens, cover, rank))
  p = np.exp(np.asarray(logp))
  for b in range(2):
    for c in range(3):
      lo, hi = np.asarray(cover[b, c])
      want = 0.0 if lo < 0 else np.log(sum(p[b, c, v] for v in range(6) if lo <= rank[v] < hi)) - np.log(
          p[b, c, tokens[b, c]])
      assert delta[b, c] == pytest.approx(max(want, 0.0), abs=1e-5), (b, c)
  # + the delta of the token ending a span, - that of the token ending the span before it
  delta_BxN = jnp.asarray([[0.5, 0.0, 0.25]])
  cover_BxNx4 = jnp.asarray([[[0, 1, 0, 1], [-1, -1, -1, -1], [0, 1, 1, -1]]], jnp.int32)
  spans = jnp.asarray([[0, 1, 1]], jnp.int32)
  np.testing.assert_allclose(np.asarray(span_corrections(delta_BxN, cover_BxNx4, spans)), [[0.5, -0.25, -0.25]])


def _tabular(sequences: dict, probability: dict, target: tuple, covers: dict) -> tuple[list, list]:
  """Per token of `target`: its log-prob under the model writing text w with probability[w] as sequences[w], and
  its cover delta where `covers` ({position: token ids of the cover}) names one (0 elsewhere)."""
  mass = lambda k, ok=None: sum(p for w, p in probability.items() if tuple(sequences[w][:k - 1]) == target[:k - 1]
                                and (ok(sequences[w][k - 1]) if ok else tuple(sequences[w][:k]) == target[:k])
                                and len(sequences[w]) >= k)
  logp = [float(np.log(mass(k + 1) / mass(k))) if k else float(np.log(mass(1))) for k in range(len(target))]
  delta = [float(np.log(mass(k + 1, lambda v: v in covers[k]) / mass(k + 1))) if k in covers else 0.0
           for k in range(len(target))]
  return logp, delta


def _text_distribution(char, number) -> tuple[dict, dict, dict]:
  """(probability of each text, its student tokens, its teacher tokens), each ending with the side's EOS."""
  probability = {"7": 0.2, "76": 0.3, "765": 0.1, "3+4": 0.15, "35": 0.25}
  student = {w: tuple(char.encode(w, add_special_tokens=False)) + (char.eos_token_id,) for w in probability}
  teacher = {w: tuple(number.encode(w, add_special_tokens=False)) + (number.eos_token_id,) for w in probability}
  return probability, student, teacher


@pytest.mark.parametrize("eos", [True, False])
def test_a_student_that_states_the_teachers_text_distribution_has_zero_advantage_on_corrected_spans(tokenizers, eos):
  """The distribution of test_crosstok's zero-advantage test, spans corrected: "3+4" now splits after "3" (a digit
  could follow; the teacher would pair it), and a row cut after a digit keeps its last span. Per span, each side's
  log-prob plus its corrections (+ its last token's delta, - the previous span's) must agree."""
  char, number = tokenizers["char"], tokenizers["number"]
  view = _view(char, number)
  probability, student, teacher = _text_distribution(char, number)
  corrected = 0
  for text in probability:
    arrays, stats = _row(view, text, eos)
    corrected += stats["boundaries_corrected"]
    s_target, t_target = student[text][:None if eos else -1], teacher[text][:None if eos else -1]
    sides = []
    for target, sequences, cover, table, span_key in (
        (s_target, student, arrays["student_cover_BxRx4"][0], view.covers[0], "student_span_BxR"),
        (t_target, teacher, arrays["teacher_cover_BxRtx4"][0], view.covers[1], "teacher_span_BxRt")):
      ids_of = {int(r): i for i, r in enumerate(table.rank_V) if r >= 0}
      covers = {k: {ids_of[r] for r in range(lo, hi)} for k, (lo, hi, _, _) in enumerate(cover[:len(target)])
                if lo >= 0}
      logp, delta = _tabular(sequences, probability, target, covers)
      span = arrays[span_key][0, :len(target)]
      totals = {}
      for k, s in enumerate(span):
        if s != UNSCORED:
          totals[int(s)] = totals.get(int(s), 0.0) + logp[k]
      for k, (_, _, end, after) in enumerate(cover[:len(target)]):
        if end >= 0:
          totals[int(end)] = totals.get(int(end), 0.0) + delta[k]
          if after >= 0:
            totals[int(after)] = totals.get(int(after), 0.0) - delta[k]
      sides.append({s: v for s, v in totals.items() if s in set(span.tolist())})
    assert sides[0].keys() == sides[1].keys() and sides[0], text
    for s in sides[0]:
      assert abs(sides[0][s] - sides[1][s]) < 1e-9, (text, eos, s, sides)
  # after "3" in "3+4"; cut, also after "3+4"'s "4", "7" and "765"'s "5" (the teacher pairs a next digit with them;
  # after "76" and "35" it would not: settled)
  assert corrected == (1 if eos else 4)


def test_settled_mode_and_one_tokenizer_have_no_corrections(tokenizers):
  """Without covers the view is unchanged (no cover arrays); with one tokenizer on both sides every boundary is
  settled, so corrected mode corrects none."""
  char, number = tokenizers["char"], tokenizers["number"]
  settled, _ = _row(_view(char, number, corrected=False), "3+4")
  corrected, stats = _row(_view(char, number), "3+4")
  assert "student_cover_BxRx4" not in settled and stats["boundaries_corrected"] == 1
  assert settled["student_span_BxR"][0, :4].tolist() == [0, 0, 1, 1]  # 3+ | 4 <eos>
  assert corrected["student_span_BxR"][0, :4].tolist() == [0, 1, 2, 2]  # 3 | + | 4 <eos>
  same, stats = _row(_view(char, char), "3+4")
  assert stats["boundaries_corrected"] == 0 and (same["student_cover_BxRx4"] == -1).all()


def test_the_teachers_program_adds_its_cover_corrections(tokenizers, tmp_path):
  """span_score_program with covers: each student token's span total is the teacher's token log-probs plus, at
  corrected boundaries, + log C - log p of the span's last teacher token and - that of the previous span's,
  against the same sums from the teacher's whole log-softmax in numpy."""
  from flax import nnx
  from opd_jax.crosstok.scoring import _teacher_inputs, span_score_program
  from opd_jax.data.number_tokenizer import VOCAB
  from opd_jax.models import Decoder, ModelConfig
  from opd_jax.objectives.logprobs import response_hidden
  config = ModelConfig(model_type="llama", vocab_size=len(VOCAB) + 2, hidden_size=32, intermediate_size=64,
                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                       eos_token_id=(VOCAB["<eos>"],), pad_token_id=0)
  model = Decoder(config, rngs=nnx.Rngs(0))
  char, number = tokenizers["char"], tokenizers["number"]
  view = CrossTokenizerView(char, number, "plain", ["1+2="], (char.eos_token_id,), max_prompt=16, max_response=16,
                            covers=(CoverTable(char, len(char), special_ids(char) | {char.eos_token_id}),
                                    CoverTable(number, config.vocab_size, special_ids(number))))
  arrays, stats = _row(view, "3+4", eos=False)
  assert stats["boundaries_corrected"] == 2  # after "3", and the cut end after "4" (a digit would pair with both)
  graphdef, state = nnx.split(model)
  inputs = tuple(map(jnp.asarray, _teacher_inputs(arrays)))
  got = np.asarray(span_score_program(graphdef, 1.0, 0, cover_rank=view.covers[1].rank_V)(state, *inputs).logp_BxR)
  hidden = response_hidden(model, *inputs[:4])
  logp = np.asarray(jax.nn.log_softmax(model.logits(hidden), axis=-1))[0]
  tokens, mask = arrays["teacher_response_BxRt"][0], arrays["teacher_mask_BxRt"][0]
  t_span, cover, rank = arrays["teacher_span_BxRt"][0], arrays["teacher_cover_BxRtx4"][0], view.covers[1].rank_V
  totals = {}
  for j in range(int(mask.sum())):
    if t_span[j] >= 0:
      totals[t_span[j]] = totals.get(t_span[j], 0.0) + logp[j, tokens[j]]
    lo, hi, end, after = cover[j]
    if lo >= 0:
      delta = np.log(np.exp(logp[j])[(rank >= lo) & (rank < hi)].sum()) - logp[j, tokens[j]]
      totals[end] = totals.get(end, 0.0) + delta
      if after >= 0:
        totals[after] = totals.get(after, 0.0) - delta
  s_span = arrays["student_span_BxR"][0]
  want = [totals.get(s, 0.0) if s >= 0 else 0.0 for s in s_span]
  np.testing.assert_allclose(got[0], want, atol=1e-5)
  assert s_span[:4].tolist() == [0, 1, 2, UNSCORED]  # 3 | + | 4


def _next_token_logits(sequences: dict, probability: dict, target: tuple, vocab: int) -> np.ndarray:
  """[len(target) + 1, vocab]: at each position k, log p(next token | target[:k]) of the model writing text w with
  probability[w] as sequences[w] (-1e9 where p is 0; uniform where no text has that prefix)."""
  out = np.full((len(target) + 1, vocab), -1e9, np.float32)
  for k in range(len(target) + 1):
    following = {}
    for w, p in probability.items():
      if tuple(sequences[w][:k]) == target[:k] and len(sequences[w]) > k:
        following[sequences[w][k]] = following.get(sequences[w][k], 0.0) + p
    if not following:
      out[k] = 0.0
    for token, p in following.items():
      out[k, token] = np.log(p / sum(following.values()))
  return out


@pytest.fixture(scope="module")
def marginal_kl(tokenizers):
  """(view, kl): kl(s_logits, t_logits, s_prev, t_prev, cover, corrected) is divergence_marginalized on the pair's
  tables, jitted once for every text and both tests' [1, 16, V] shapes (eager dispatch took ~15 s per test)."""
  from opd_jax.crosstok.projection import character_events
  from opd_jax.objectives.marginal import divergence_marginalized
  char, number = tokenizers["char"], tokenizers["number"]
  view = _view(char, number)
  longest = max(view.covers[0].longest, view.covers[1].longest)
  s_events, t_events, E, _, (s_offsets, t_offsets) = character_events(
      char, number, len(char), len(number), (char.eos_token_id,), number.eos_token_id, max_chars=longest + 1)
  events = (jnp.asarray(s_events), jnp.asarray(t_events), E, None,
            (jnp.asarray(s_offsets), jnp.asarray(t_offsets), jnp.asarray(view.covers[1].rank_V)))
  rank_Vs = jnp.asarray(view.covers[0].rank_V)

  @functools.partial(jax.jit, static_argnames="corrected")
  def kl(s_logits, t_logits, s_prev, t_prev, cover, corrected=True):
    return divergence_marginalized(s_logits, t_logits, events, 1.0, None,
                                   (s_prev, t_prev, cover, rank_Vs) if corrected else None)
  return view, kl


@pytest.mark.parametrize("eos", [True, False])
def test_next_character_marginals_agree_at_corrected_boundaries_for_a_student_that_states_the_teachers_text(
    tokenizers, marginal_kl, eos):
  """The marginal form with corrected boundaries: at every scored span start both sides' next-character
  distributions, made character-level one token back where the boundary was corrected, are equal for a student
  that states the teacher's text distribution (KL 0); uncorrected, the teacher's after "3" in "3+4" is "3, then
  no digit" and differs."""
  char, number = tokenizers["char"], tokenizers["number"]
  view, kl = marginal_kl
  probability, student, teacher = _text_distribution(char, number)
  corrected_starts = 0
  for text in probability:
    arrays, _ = _row(view, text, eos)
    s_logits = _next_token_logits(student, probability, student[text], len(char))
    t_logits = _next_token_logits(teacher, probability, teacher[text], len(number))
    first, cover = arrays["teacher_first_BxR"][0], arrays["marginal_cover_BxRx6"][0]
    starts = [k for k in range(16) if first[k] >= 0]
    # every one of the 16 positions is computed (fixed shapes: one compile); only span starts are read
    pick = lambda logits, index: jnp.asarray(logits[np.clip(index, 0, len(logits) - 1)][None])
    s_index, t_index = np.arange(16), np.maximum(first, 0)
    args = (pick(s_logits, s_index), pick(t_logits, t_index), pick(s_logits, s_index - 1),
            pick(t_logits, t_index - 1), jnp.asarray(cover[None]))
    at_starts = lambda corrected: np.asarray(kl(*args, corrected=corrected))[0, starts]
    np.testing.assert_allclose(at_starts(True), 0.0, atol=1e-5, err_msg=f"{text} eos={eos}")
    corrected_here = [i for i, k in enumerate(starts) if cover[k, 0] >= 0]
    corrected_starts += len(corrected_here)
    if text == "3+4":  # after "3": the teacher's plain marginal is of "3, then no digit"
      assert corrected_here and at_starts(False)[corrected_here[0]] > 0.1
  assert corrected_starts == 1  # the span start after "3" in "3+4" (a cut end starts no span)
  # the gradient is finite at every position, those without a cover too (they normalize a total of 0)
  arrays, _ = _row(view, "3+4", eos)
  rng = np.random.RandomState(0)
  s_logits, t_logits = (jnp.asarray(rng.randn(1, 16, len(tok)), jnp.float32) for tok in (char, number))
  cover = jnp.asarray(arrays["marginal_cover_BxRx6"])
  loss = lambda s, s_prev: jnp.sum(kl(s, t_logits, s_prev, t_logits, cover))
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.grad(loss, argnums=(0, 1))(s_logits, s_logits))
