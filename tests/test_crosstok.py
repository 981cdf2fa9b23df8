"""Cross-tokenizer OPD (opd_jax/crosstok): span alignment, the span objective's reduction to reverse_kl_pg with one
tokenizer, and a run whose teacher tokenizes numbers differently from its student."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import common
from opd_jax.crosstok.align import UNSCORED, align, token_ends
from opd_jax.models.prompt_format import PromptFormat
from opd_jax.crosstok.projection import character_events
from opd_jax.crosstok.scoring import _teacher_inputs, span_score_program
from opd_jax.crosstok.view import CrossTokenizerView
from opd_jax.data.char_tokenizer import build_char_tokenizer
from opd_jax.data.number_tokenizer import VOCAB as NUMBER_VOCAB, build_number_tokenizer
from opd_jax.errors import InputError
from opd_jax.experiments.sweep import set_field
from opd_jax.models import Decoder, ModelConfig, load_pretrained, load_tokenizer, save_pretrained
from opd_jax.objectives.logprobs import score
from opd_jax.objectives import losses, marginal
from opd_jax.objectives.losses import LossInputs, ObjectiveConfig, compute_loss
from opd_jax.objectives.spans import span_starts, span_total
from opd_jax.spec import RunSpec
from opd_jax.train.loop import train
from tests.gguf_files import byte_alphabet


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
  root = tmp_path_factory.mktemp("tokenizers")
  build_char_tokenizer(str(root / "char"))
  build_number_tokenizer(str(root / "number"))
  return {"char": load_tokenizer(str(root / "char")), "number": load_tokenizer(str(root / "number")),
          "dirs": {"char": str(root / "char"), "number": str(root / "number")}}


def _view(student, teacher, prompts=("1+2=",), fmt="plain", **kw):
  kw = {"max_prompt": 16, "max_response": 16, **kw}
  return CrossTokenizerView(student, teacher, fmt, list(prompts), (student.eos_token_id,), **kw)


def _row(view, text, eos=True):
  ids = view.student.encode(text, add_special_tokens=False) + ([view.student.eos_token_id] if eos else [])
  response = np.zeros((1, 16), np.int32)
  response[0, :len(ids)] = ids
  mask = (np.arange(16) < len(ids)).astype(np.float32)[None]
  return view.build(np.zeros(1, np.int64), response, mask)


# ----------------------------------------------------------------------------------------------- alignment

def test_multi_digit_numbers_are_spans_of_single_digits(tokenizers):
  """The student writes digits one by one, the teacher pairs them: "12" is one span of two student tokens and one
  teacher token. A boundary the next character could still move is not a span end: after "1" (a digit may follow,
  and the teacher would pair it) "1" joins "+"; after the last "5" the EOS joins "5" (the teacher's one-digit "5"
  means "5, then no digit"); a row cut there leaves its last span unscored."""
  view = _view(tokenizers["char"], tokenizers["number"])
  arrays, stats = _row(view, "12+345")
  spans = arrays["student_span_BxR"][0, :7].tolist()
  assert spans == [0, 0, 1, 2, 2, 3, 3]  # 1 2 | + | 3 4 | 5 <eos>
  teacher = view.teacher.convert_ids_to_tokens(arrays["teacher_response_BxRt"][0, :5].tolist())
  assert teacher == ["12", "+", "34", "5", "<eos>"]
  assert arrays["teacher_span_BxRt"][0, :6].tolist() == [0, 1, 2, 3, 3, UNSCORED]
  assert stats["spans"] == stats["spans_scored"] == 4 and stats["tokens_scored"] == 7
  assert stats["boundaries_unsettled"] == 0  # the text's end is counted apart: it ends a span either way
  arrays, stats = _row(view, "1+23+4", eos=False)
  assert arrays["student_span_BxR"][0, :7].tolist() == [0, 0, 1, 1, 2, UNSCORED, UNSCORED]  # 1+ | 23 | + | (4)
  assert stats["boundaries_unsettled"] == 1 and stats["spans_unscorable"] == 1 and stats["spans_scored"] == 3


def _tabular_logp(sequences: dict, probability: dict, target: tuple) -> list[float]:
  """Per token of `target`: its log-prob under the model that writes text w with probability[w], as a token
  sequence sequences[w] (P(next token | tokens so far) from the texts' own tokenizations)."""
  mass = lambda k: sum(p for w, p in probability.items() if tuple(sequences[w][:k]) == target[:k])
  return [float(np.log(mass(k + 1) / mass(k))) for k in range(len(target))]


def test_a_student_that_states_the_teachers_text_distribution_has_zero_advantage_on_every_span(tokenizers):
  """Both sides are the same distribution over texts, each written in its own tokenization (the teacher pairs
  digits). Every scored span's log-probs must then agree on both sides, or the objectives would push a student
  that is already right. Spans ending where a digit could still follow (one-digit "7": to the teacher "7, then no
  digit") would not: log 0.2 against log 0.6."""
  char, number = tokenizers["char"], tokenizers["number"]
  view = _view(char, number)
  probability = {"7": 0.2, "76": 0.3, "765": 0.1, "3+4": 0.15, "35": 0.25}
  student = {w: tuple(char.encode(w, add_special_tokens=False)) + (char.eos_token_id,) for w in probability}
  teacher = {w: tuple(number.encode(w, add_special_tokens=False)) + (number.eos_token_id,) for w in probability}
  for text in probability:
    arrays, stats = _row(view, text)
    s_logp = _tabular_logp(student, probability, student[text])
    t_logp = _tabular_logp(teacher, probability, teacher[text])
    assert arrays["teacher_response_BxRt"][0, :len(t_logp)].tolist() == list(teacher[text])
    s_span = arrays["student_span_BxR"][0, :len(s_logp)]
    t_span = arrays["teacher_span_BxRt"][0, :len(t_logp)]
    assert stats["spans_scored"] >= 1 and (s_span >= 0).all()
    for span in set(s_span.tolist()):
      s_total = sum(v for v, k in zip(s_logp, s_span) if k == span)
      t_total = sum(v for v, k in zip(t_logp, t_span) if k == span)
      assert abs(s_total - t_total) < 1e-9, (text, span, s_total, t_total)


def test_whitespace_merging_tokens_and_unknown_teacher_tokens():
  """A teacher token spanning two student tokens (" +") makes them one span; a span holding the teacher's unknown
  token is not scored. Ends are character offsets (align's inputs)."""
  # text " +x": student " ", "+", "x"; teacher " +", "x" with "x" unknown to the teacher
  alignment = align([1, 2, 3], [2, 3], [True, False], 3)
  assert alignment.student_span == [0, 0, 1] and alignment.teacher_span == [0, 1]
  assert alignment.valid == [True, False]


def test_multibyte_characters_split_by_byte_level_tokens():
  """A byte-level BPE without merges spells "é" with two tokens: the first ends inside the character, so it has no
  boundary of its own and joins the second's span."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast
  vocab = {ch: i for i, ch in enumerate(byte_alphabet())}
  backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  byte_level = PreTrainedTokenizerFast(tokenizer_object=backend)
  text = "aé!"
  ids = byte_level.encode(text, add_special_tokens=False)
  decode = lambda x: byte_level.decode(x, clean_up_tokenization_spaces=False)
  assert len(ids) == 4 and token_ends(decode, ids, text) == [1, None, 2, 3]
  alignment = align(token_ends(decode, ids, text), [1, 2, 3], [True, True, True], 3)  # a character-level teacher
  assert alignment.student_span == [0, 1, 1, 2] and all(alignment.valid)


def test_special_tokens_and_tokens_that_spell_nothing_are_scored_as_unreadable(tokenizers):
  """A student special token (here <pad>) is chat format, not text: it joins the last span with the teacher
  log-prob UNREADABLE_LOGP, and nothing after it is scored. A token that spells nothing (a padded embedding row,
  id 25 of a 32-row model over an 18-token vocabulary) stays in the span of the text before it, with the same
  penalty: left free, it would lower the student's log-prob of a span whose teacher log-prob it leaves unchanged."""
  from opd_jax.crosstok.view import UNREADABLE_LOGP
  view = _view(tokenizers["char"], tokenizers["number"])
  char = tokenizers["char"]
  encode = lambda text: char.encode(text, add_special_tokens=False)
  ids = encode("12") + [char.pad_token_id] + encode("3")
  response = np.zeros((1, 16), np.int32)
  response[0, :4] = ids
  arrays, stats = view.build(np.zeros(1, np.int64), response, (np.arange(16) < 4).astype(np.float32)[None])
  assert arrays["student_span_BxR"][0, :4].tolist() == [0, 0, 0, UNSCORED]
  assert arrays["fixed_logp_BxR"][0, :4].tolist() == [0, 0, np.float32(UNREADABLE_LOGP), 0]
  assert stats["tokens_special"] == 1 and stats["tokens_scored"] == 3 and stats["tokens_unreadable"] == 1
  ids = encode("12") + [25] + encode("+3") + [char.eos_token_id]
  response[0, :6] = ids
  arrays, stats = view.build(np.zeros(1, np.int64), response, (np.arange(16) < 6).astype(np.float32)[None])
  assert arrays["student_span_BxR"][0, :6].tolist() == [0, 0, 0, 1, 2, 2]  # 12(25) | + | 3 <eos>
  assert arrays["fixed_logp_BxR"][0, 2] == np.float32(UNREADABLE_LOGP) and stats["tokens_unreadable"] == 1
  assert not arrays["fixed_logp_BxR"][0, [0, 1, 3, 4, 5]].any()


def test_a_response_prefix_is_teacher_context_not_a_span(tokenizers):
  """With response_prefix " " the teacher reads " 12+345": its space token is context (no span); the spans are
  those without it."""
  plain, _ = _row(_view(tokenizers["char"], tokenizers["number"]), "12+345")
  arrays, stats = _row(_view(tokenizers["char"], tokenizers["number"], response_prefix=" "), "12+345")
  number = tokenizers["number"]
  assert number.convert_ids_to_tokens(arrays["teacher_response_BxRt"][0, :2].tolist()) == [" ", "12"]
  assert arrays["teacher_span_BxRt"][0, :6].tolist() == [UNSCORED, 0, 1, 2, 3, 3]
  np.testing.assert_array_equal(arrays["student_span_BxR"], plain["student_span_BxR"])
  assert arrays["teacher_first_BxR"][0, :7].tolist() == [1, UNSCORED, 2, 3, UNSCORED, 4, UNSCORED]
  assert stats["spans_scored"] == 4


def test_truncated_teacher_response_and_formats(tokenizers):
  view = _view(tokenizers["char"], tokenizers["number"], max_response=2)
  arrays, stats = _row(view, "12+345")
  assert stats["spans_truncated"] == 2 and arrays["student_span_BxR"][0, :4].tolist() == [0, 0, 1, UNSCORED]
  number = tokenizers["number"]
  assert PromptFormat("Q: {prompt}\nA:", number).text("1+2=") == "Q: 1+2=\nA:"
  for bad, fragment in (("Q: {question}", "does not render"), ("Q:", "neither"), ("chat", "no chat template")):
    with pytest.raises(InputError, match=fragment):
      PromptFormat(bad, number)
  with pytest.raises(InputError, match="not one"):
    _view(tokenizers["char"], number, teacher_end="12+")
  with pytest.raises(InputError, match="max_teacher_prompt_tokens"):
    _view(tokenizers["char"], number, prompts=("1+2=" * 9,))


# ------------------------------------------------------------------------------------- one tokenizer: equal

def test_span_total_of_single_token_spans_is_the_token_value():
  values = jax.random.normal(jax.random.key(0), (3, 7))
  spans = jnp.broadcast_to(jnp.arange(7), (3, 7)).at[1, 5:].set(UNSCORED)
  out = span_total(values, spans, spans)
  np.testing.assert_array_equal(np.asarray(out), np.where(np.asarray(spans) >= 0, np.asarray(values), 0.0))


def test_one_tokenizer_on_both_sides_is_reverse_kl_pg_and_reverse_kl(tiny_pair):
  """The student's own tokenizer as the 'other' one: every span is one token, the span program's teacher
  log-probs and hidden states equal the token scoring program's (two XLA programs: to float rounding), and given
  the same log-probs the span objective's loss and gradient equal reverse_kl_pg's exactly. reverse_kl then
  marginalizes nothing (test_character_events_...) and reads those hidden states at every token: today's exact
  reverse KL."""
  tokenizer = load_tokenizer(tiny_pair["student"])
  teacher_graphdef, teacher_state = nnx.split(load_pretrained(tiny_pair["teacher"]))
  prompts = ["1+2=", "34+5="]
  view = CrossTokenizerView(tokenizer, tokenizer, "plain", prompts, (1,), max_prompt=8, max_response=8)
  view_prompts = _student_prompts(tokenizer, prompts, 8)
  rng = np.random.RandomState(0)
  response = rng.randint(2, 18, (2, 8)).astype(np.int32)
  response[0, 5] = 1  # row 0 ends with EOS after 5 tokens, row 1 runs to the cap
  mask = np.ones((2, 8), np.float32)
  mask[0, 6:] = 0
  arrays, stats = view.build(np.arange(2), response, mask)
  assert stats["spans_scored"] == stats["spans"] == 14 and stats["tokens_scored"] == 14
  np.testing.assert_array_equal(arrays["teacher_response_BxRt"] * arrays["teacher_mask_BxRt"], response * mask)
  spans = jnp.asarray(arrays["student_span_BxR"])
  assert float(jnp.sum(span_starts(spans))) == 14  # every token starts its span
  spanned = span_score_program(teacher_graphdef, 1.0, 0, hidden=True)(
      teacher_state, *map(jnp.asarray, _teacher_inputs(arrays)))
  plain = score(teacher_graphdef, teacher_state, *view_prompts, response, mask, temperature=1.0, return_hidden=True)
  token_logp = plain.logp_BxR
  np.testing.assert_allclose(np.asarray(spanned.logp_BxR), np.asarray(token_logp), atol=1e-6)
  # the full-distribution form reads the teacher's hidden state at span starts: here at every scored token
  np.testing.assert_allclose(np.asarray(spanned.hidden_BxRxD) * mask[..., None],
                             np.asarray(plain.hidden_BxRxD) * mask[..., None], atol=1e-5)
  learner = jax.random.normal(jax.random.key(1), (2, 8)) * jnp.asarray(mask)
  sampler = learner + 0.1

  def loss(learner_BxR, span_BxR):
    inputs = LossInputs(learner_BxR, sampler, token_logp, jnp.asarray(mask), span_BxR=span_BxR)
    return compute_loss(inputs, ObjectiveConfig(importance="tis"))[0]
  plain, spanned = jax.grad(loss)(learner, None), jax.grad(loss)(learner, spans)
  np.testing.assert_array_equal(np.asarray(plain), np.asarray(spanned))
  assert float(loss(learner, None)) == float(loss(learner, spans))


def _student_prompts(tokenizer, prompts, length):
  from opd_jax.data.batching import encode_prompts
  from opd_jax.data.task import Problem
  return encode_prompts(tokenizer, [Problem(p, None) for p in prompts], length)


def test_character_events_marginalize_both_vocabularies(tokenizers):
  """The teacher's "12" and "1" and the student's "1" are one event (next character "1"); both EOS are "end"; <pad>
  is shared by spelling; the teacher's <unk> is its own. One vocabulary on both sides: no events (token KL)."""
  char, number = tokenizers["char"], tokenizers["number"]
  student, teacher, count, shifted = character_events(char, number, len(char), len(number), (char.eos_token_id,),
                                                      number.eos_token_id)
  assert shifted is None  # no response prefix
  s_id, t_id = char.get_vocab(), number.get_vocab()
  assert student[s_id["1"]] == teacher[t_id["12"]] == teacher[t_id["1"]] == teacher[t_id["19"]]
  assert student[s_id["1"]] != teacher[t_id["21"]]
  assert student[s_id["<eos>"]] == teacher[t_id["<eos>"]] and student[s_id["<pad>"]] == teacher[t_id["<pad>"]]
  assert teacher[t_id["<unk>"]] not in student
  # a padded row of the student's embedding spells nothing: an event no teacher token is in ("unreadable")
  student, teacher, count, _ = character_events(char, number, 32, len(number), (char.eos_token_id,),
                                                number.eos_token_id)
  assert len(set(student[len(char):])) == 1 and student[-1] not in teacher and count == len(char) + 2
  assert character_events(char, char, len(char), len(char), (1,), 1) is None


def test_marginalized_and_uld_divergences():
  """Each token its own event: the exact reverse KL (to the renormalization's rounding). Merging two teacher tokens
  into one event adds their mass. ULD is 0 for a permuted teacher: it compares sorted probabilities, not events
  (why it is only a baseline)."""
  key_s, key_t = jax.random.split(jax.random.key(0))
  student, teacher = jax.random.normal(key_s, (2, 3, 6)), jax.random.normal(key_t, (2, 3, 6))
  identity = (jnp.arange(6), jnp.arange(6), 6)
  np.testing.assert_allclose(np.asarray(marginal.divergence_marginalized(student, teacher, identity, 1.0)),
                             np.asarray(losses.divergence_exact(student, teacher, 1.0, 1.0)), atol=1e-6)
  merged = (jnp.asarray([0, 1, 2, 3, 4, -1]), jnp.asarray([0, 0, 1, 2, 3, 4]), 5)  # teacher 0, 1 -> event 0
  p, t = jax.nn.softmax(student, axis=-1), jax.nn.softmax(teacher, axis=-1)
  q_s = p[..., :5] / p[..., :5].sum(-1, keepdims=True)
  q_t = jnp.concatenate([t[..., :1] + t[..., 1:2], t[..., 2:]], -1)
  want = jnp.sum(q_s * (jnp.log(q_s) - jnp.log(q_t)), -1)
  np.testing.assert_allclose(np.asarray(marginal.divergence_marginalized(student, teacher, merged, 1.0)),
                             np.asarray(want), atol=1e-6)
  top = lambda logits: jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), 4)[0]
  np.testing.assert_allclose(np.asarray(losses.divergence_uld(student, top(student[..., ::-1]), 1.0)), 0, atol=1e-6)
  assert float(jnp.min(losses.divergence_uld(student, top(teacher), 1.0))) > 0


def _space_merging_tokenizer(out_dir: str):
  """A teacher tokenizer that writes a space together with the token after it (" 12", " +"), as SentencePiece
  writes "▁The": two-digit numbers and single characters, each also with a leading space."""
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast
  from opd_jax.data.char_tokenizer import CHARS
  words = [f"{a}{b}" for a in "0123456789" for b in "0123456789"] + [c for c in CHARS if c != " "]
  vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2, " ": 3}
  for w in words:
    vocab.setdefault(w, len(vocab))
    vocab.setdefault(" " + w, len(vocab))
  backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  backend.pre_tokenizer = pre_tokenizers.Split(Regex(r" ?\d\d| ?[^ ]| "), behavior="isolated")
  backend.decoder = decoders.Fuse()
  PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
                          ).save_pretrained(out_dir)
  return load_tokenizer(out_dir)


def test_a_teacher_token_that_merged_the_response_prefix_is_read_after_the_prefix(tokenizers, tmp_path):
  """With response_prefix " " the teacher's first token is " 12": its next-character event there is "1" (the
  character after the prefix), not " ". The view marks that position (after_prefix_BxR) and the marginal
  divergence reads the fourth table there: a teacher sure of " 12" and a student sure of "1" agree (KL 0)."""
  char = tokenizers["char"]
  teacher = _space_merging_tokenizer(str(tmp_path / "space"))
  assert teacher.convert_ids_to_tokens(teacher.encode(" 12+3", add_special_tokens=False)) == [" 12", "+", "3"]
  view = _view(char, teacher, response_prefix=" ")
  arrays, _ = _row(view, "12+3")
  assert arrays["after_prefix_BxR"][0, :5].tolist() == [1, 0, 0, 0, 0]
  arrays, _ = _row(_view(char, tokenizers["number"], response_prefix=" "), "12+3")  # " " is its own token
  assert not arrays["after_prefix_BxR"].any()
  events = character_events(char, teacher, len(char), len(teacher), (char.eos_token_id,), teacher.eos_token_id, " ")
  student_events, teacher_events, count, shifted = events
  s_id, t_id = char.get_vocab(), teacher.get_vocab()
  assert shifted[t_id[" 12"]] == student_events[s_id["1"]] == teacher_events[t_id["12"]]
  assert teacher_events[t_id[" 12"]] == student_events[s_id[" "]] and shifted[t_id["12"]] == -1
  sure = lambda index, size: jnp.where(jnp.arange(size) == index, 30.0, 0.0)[None, None]
  table = tuple(jnp.asarray(e) for e in (student_events, teacher_events)) + (count, jnp.asarray(shifted))
  student_logits, teacher_logits = sure(s_id["1"], len(char)), sure(t_id[" 12"], len(teacher))
  kl = lambda flag: float(marginal.divergence_marginalized(student_logits, teacher_logits, table, 1.0,
                                                         jnp.full((1, 1), flag))[0, 0])
  assert kl(1.0) < 1e-6 and kl(0.0) > 10


def test_a_spans_later_tokens_take_the_span_policy_gradient_under_vocabulary_objectives():
  """reverse_kl / uld across tokenizers: the divergence where a span starts, the span form's policy gradient at its
  later tokens (none left without a signal); with every span one token, the divergence alone, exactly."""
  divergence = jnp.asarray([[0.3, 0.5, 0.7, 0.2]])
  # the teacher's log-prob of each token's span (what span scoring hands every token of a span)
  learner, teacher = jnp.asarray([[-1.0, -2.0, -0.5, -1.5]]), jnp.asarray([[-4.0, -4.0, -1.0, -1.0]])
  mask = jnp.ones((1, 4))
  per_token = lambda span: losses.token_losses(LossInputs(learner, learner, teacher, mask, divergence,
                                                          span_BxR=span), ObjectiveConfig(name="reverse_kl"))[0]
  np.testing.assert_array_equal(np.asarray(per_token(jnp.asarray([[0, 1, 2, 3]]))), np.asarray(divergence))
  # span 0 = tokens 0, 1 (student total -3, teacher -4: advantage -1); span 1 = tokens 2, 3 (-2, teacher -1: +1)
  got = np.asarray(per_token(jnp.asarray([[0, 0, 1, 1]])))
  np.testing.assert_allclose(got, [[0.3, -(-1.0) * -2.0, 0.7, -(1.0) * -1.5]])



def _chain_loss(z_student, teacher_logits, events, sampled: int, mode: str):
  """The loss of one response holding one span of one sampled token, under marginal_span=mode."""
  q_s, q_t = marginal.marginals(z_student[None, None], teacher_logits[None, None], events, 1.0)
  first_s, first_t = marginal.first_character_logq(q_s, q_t, events[0], jnp.asarray([[sampled]]))
  learner = jax.nn.log_softmax(z_student)[sampled].reshape(1, 1)
  teacher = jax.nn.log_softmax(teacher_logits)[sampled].reshape(1, 1)  # the teacher's log-prob of the same text
  inputs = LossInputs(learner, jax.lax.stop_gradient(learner), teacher, jnp.ones((1, 1)),
                      marginal.marginal_kl(q_s, q_t), span_BxR=jnp.zeros((1, 1), jnp.int32),
                      first_logq_BxR=first_s, teacher_first_logq_BxR=first_t)
  return losses.compute_loss(inputs, ObjectiveConfig(name="reverse_kl", marginal_span=mode))[0]


def test_the_chain_split_scores_a_spans_rest_given_its_first_character():
  """Tokens a, ab, ac, b (first characters a, a, a, b) on both sides, each response one span of one token. Both
  sides give "a..." 0.8; the teacher prefers "ab" to "ac" (0.6 against 0.1), the student "ac" (0.4 against 0.3).
  'first' has zero gradient (the first characters agree), so the student never learns "ab" over "ac". 'chain'
  lowers "ac" once sampled, and its gradient averaged over the student's own samples is the exact token-level
  reverse KL's gradient (the chain rule: KL of the first character + the expected KL of the rest given it)."""
  events = (jnp.asarray([0, 0, 0, 1]), jnp.asarray([0, 0, 0, 1]), 2)
  p_student, p_teacher = jnp.asarray([0.1, 0.3, 0.4, 0.2]), jnp.asarray([0.1, 0.6, 0.1, 0.2])
  z, t = jnp.log(p_student), jnp.log(p_teacher)
  grad = lambda sampled, mode: np.asarray(jax.grad(_chain_loss)(z, t, events, sampled, mode))
  for sampled in range(4):
    np.testing.assert_allclose(grad(sampled, "first"), 0.0, atol=1e-6)
  after_ac = grad(2, "chain")
  assert after_ac[2] - after_ac[1] > 0.1  # descending it lowers log p(ac) - log p(ab)
  expected = sum(float(p_student[u]) * grad(u, "chain") for u in range(4))
  exact = np.asarray(jax.grad(lambda z: losses.divergence_exact(z[None, None], t[None, None], 1.0, 1.0)[0, 0])(z))
  np.testing.assert_allclose(expected, exact, atol=1e-6)
  with pytest.raises(InputError, match="marginal_span='chain'.*needs objective.name='reverse_kl'"):
    ObjectiveConfig(name="reverse_kl_pg", marginal_span="chain")


# ------------------------------------------------------------------------------------------- in the loop

@pytest.fixture(scope="module")
def number_teacher(tmp_path_factory):
  """A random teacher whose tokenizer pairs digits (opd_jax/data/number_tokenizer.py)."""
  path = str(tmp_path_factory.mktemp("number_teacher"))
  config = ModelConfig(model_type="llama", vocab_size=len(NUMBER_VOCAB), hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                       eos_token_id=(NUMBER_VOCAB["<eos>"],), pad_token_id=0)
  save_pretrained(Decoder(config, rngs=nnx.Rngs(3)), path)
  build_number_tokenizer(path)
  return path


def _config(tiny_pair, teacher, **overrides):
  config = common.base_config("tiny")
  common.shrink_for_local_run(config)
  config.teacher, config.student = teacher, tiny_pair["student"]
  config.rollout.max_new_tokens = 12
  config.train.progress_bar = False
  config.model.attention, config.model.scan_layers = "reference", False
  config.train.export_dtype = ""
  config.cross_tokenizer.enabled = True
  config.cross_tokenizer.teacher_format = "# {prompt}"
  for key, value in overrides.items():
    set_field(config, key, value)
  return config


@pytest.mark.parametrize("objective", ["reverse_kl_pg", "reverse_kl+corrected", "uld", "reverse_kl_pg+corrected"])
def test_a_teacher_of_another_tokenizer_trains_the_student(tiny_pair, number_teacher, tmp_path, objective,
                                                          monkeypatch):
  objective, corrected = objective.split("+")[0], objective.endswith("+corrected")
  # the marginal form's character-level distributions reach the train step with corrected boundaries
  original, traced = marginal.character_level, []
  monkeypatch.setattr(marginal, "character_level", lambda *a: traced.append(1) or original(*a))
  config = _config(tiny_pair, number_teacher, **{"train.steps": 3, "train.eval_every": 3, "objective.name": objective})
  if objective == "reverse_kl":  # with a response prefix: the marginal form's prefix table reaches the train step
    config.cross_tokenizer.teacher_response_prefix = " "  # (the settled marginals train in the pairx sweep)
  if corrected:  # the covers reach the teacher's program, the train step and the held-out span KL
    config.cross_tokenizer.boundaries = "corrected"
    if objective == "reverse_kl":  # and the chain split's first characters (test_the_chain_split_...)
      config.objective.marginal_span = "chain"
  train(config, str(tmp_path))
  with open(tmp_path / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  steps = [r for r in rows if "loss" in r]
  assert steps and steps[-1]["step"] == 3 and all(np.isfinite(r["loss"]) for r in steps)
  assert all(r["skipped"] == 0 and np.isfinite(r["grad_norm"]) for r in steps)  # no non-finite gradient
  # numbers: the teacher's "12" is one span of two student digits, so spans are fewer than scored tokens
  assert all(0 < r["cross_tokenizer/token_share"] <= 1 for r in steps)
  assert any(r["cross_tokenizer/student_tokens_per_span"] > 1 for r in steps)
  evals = [r for r in rows if "eval/span_reverse_kl" in r]
  assert evals and np.isfinite(evals[-1]["eval/span_reverse_kl"]) and "eval/reverse_kl" not in evals[-1]
  assert np.isfinite(evals[-1]["eval/span_reverse_kl_per_response"])  # per-token means move with answer length
  assert any(r["cross_tokenizer/boundaries_corrected"] > 0 for r in steps) == corrected
  assert bool(traced) == (corrected and objective == "reverse_kl")
  chain = corrected and objective == "reverse_kl"
  assert all(np.isfinite(r.get("opd/rest_advantage", np.nan)) == chain for r in steps)


def test_a_served_teacher_of_another_tokenizer_scores_as_in_process(tiny_pair, number_teacher, tmp_path):
  """The span form over the wire: the served teacher scores its own tokens (the view's), spans are summed here;
  every logged value equals the in-process run's to 1e-4 and the preflight compares the two on the teacher's
  tokens."""
  from tests import servers
  steps = {"train.steps": 2, "train.eval_every": 2, "objective.name": "reverse_kl_pg"}
  train(_config(tiny_pair, number_teacher, **steps), str(tmp_path / "local"))
  with servers.teacher(f"--checkpoint={number_teacher}") as (_, url):
    train(_config(tiny_pair, number_teacher, teacher_endpoint=url, **steps), str(tmp_path / "served"))
  rows = lambda name: [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
  local, served = rows("local"), rows("served")
  assert [r["step"] for r in local] == [r["step"] for r in served]
  for want, got in zip(local, served):
    for key, value in want.items():
      if not key.startswith(("time/", "perf/", "eval/seconds")) and isinstance(value, float):
        assert got[key] == pytest.approx(value, abs=1e-4), (want["step"], key)
  first = next(r for r in served if "loss" in r)
  assert first["teacher/preflight_k3"] < 1e-8 and first["cross_tokenizer/span_share"] > 0


def test_several_teachers_each_with_its_own_tokenizer(tiny_pair, number_teacher, tmp_path):
  """config.teachers across tokenizers: prompts with a minus sign go to a teacher on the student's own tokenizer
  (its spans are single tokens), the rest to the digit-pair teacher; each row is scored by its own teacher in
  its own format, and each held-out prompt's span KL is measured against its own teacher."""
  config = _config(tiny_pair, number_teacher, **{"train.steps": 2, "train.eval_every": 2,
                                                 "objective.name": "reverse_kl_pg"})
  config.routing.teacher_name = "pairs"
  config.teachers.chars = {"checkpoint": tiny_pair["teacher"], "format": "plain"}
  config.routing.rules = ((r"-", "chars"),)
  train(config, str(tmp_path))
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  steps = [r for r in rows if "loss" in r]
  assert all(np.isfinite(r["loss"]) for r in steps) and all(r["cross_tokenizer/token_share"] > 0 for r in steps)
  assert all(r["teachers/pairs/tokens"] > 0 and r["teachers/chars/tokens"] > 0 for r in steps)
  last = rows[-1]
  assert np.isfinite(last["eval/teachers/pairs/span_reverse_kl"]) and np.isfinite(
      last["eval/teachers/chars/span_reverse_kl"])


@pytest.mark.parametrize("override,message", [
    ({"objective.name": "forward_kl"}, "the span form, the next-character marginals"),
    ({"train.eval_teacher_forced": True}, "eval_teacher_forced"),
    ({"cross_tokenizer.max_teacher_response_tokens": -1}, "max_teacher_response_tokens"),
    ({"teacher_endpoint": "http://127.0.0.1:9/v1", "objective.name": "uld"}, "use reverse_kl_pg with"),
    ({"teachers": {"other": {"checkpoint": "/nonexistent", "format": "{nothing}"}}}, "does not render"),
    ({"cross_tokenizer.boundaries": "sometimes"}, "use 'settled'"),
    ({"cross_tokenizer.boundaries": "corrected", "objective.name": "uld"}, "boundaries='corrected' scores"),
])
def test_cross_tokenizer_config_mistakes(tiny_pair, number_teacher, override, message):
  with pytest.raises(InputError, match=message):
    RunSpec.from_config(_config(tiny_pair, number_teacher, **override))


def test_different_tokenizers_without_the_flag_name_it(tiny_pair, number_teacher):
  with pytest.raises(InputError, match="cross_tokenizer.enabled=True"):
    RunSpec.from_config(_config(tiny_pair, number_teacher, **{"cross_tokenizer.enabled": False}))
  with pytest.raises(InputError, match="marginal_span='chain' splits a cross-tokenizer span"):
    RunSpec.from_config(_config(tiny_pair, number_teacher, **{
        "cross_tokenizer.enabled": False, "objective.name": "reverse_kl", "objective.marginal_span": "chain"}))
  assert os.path.isdir(number_teacher)
