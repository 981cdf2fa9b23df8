"""OPD objectives: values and gradients against independent float64 numpy computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from opd_jax.objectives import losses
from opd_jax.objectives.logprobs import token_logprobs
from opd_jax.objectives.losses import LossInputs, ObjectiveConfig, compute_loss, generalized_jsd

B, R, V = 3, 5, 7


def _np_log_softmax(z):
  z = z - z.max(-1, keepdims=True)
  return z - np.log(np.exp(z).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def data():
  rng = np.random.RandomState(0)
  mask = (rng.rand(B, R) > 0.25).astype(np.float32)
  mask[2] = 0.0  # an all-masked row
  mask[0, 0] = 1.0
  return dict(student=rng.randn(B, R, V).astype(np.float32) * 2, teacher=rng.randn(B, R, V).astype(np.float32) * 2,
              tokens=rng.randint(0, V, (B, R)), sampler_logp=(np.log(rng.rand(B, R)) * 0.5).astype(np.float32),
              mask=mask)


def _loss_of_logits(data, config):
  def f(student_logits):
    learner_logp = token_logprobs(student_logits, jnp.asarray(data["tokens"])) * data["mask"]
    teacher_logp = token_logprobs(jnp.asarray(data["teacher"]), jnp.asarray(data["tokens"])) * data["mask"]
    divergence = None
    if config.vocab_beta is not None:
      divergence = losses.divergence_from_logits(student_logits, jnp.asarray(data["teacher"]), config)
    inputs = LossInputs(learner_logp, jnp.asarray(data["sampler_logp"]), teacher_logp, jnp.asarray(data["mask"]),
                        divergence)
    return compute_loss(inputs, config)[0]
  return f


def _np_token_logp(logits, tokens):
  return np.take_along_axis(_np_log_softmax(logits.astype(np.float64)), tokens[..., None], -1)[..., 0]


def _np_weights(kind, log_ratio, m, cap, bounds):
  """Independent float64 importance weights [B, R] of every kind (sequence kinds broadcast per row)."""
  ratio = np.exp(log_ratio)
  log_rho = (log_ratio * m).sum(1)
  geo = np.exp(log_rho / np.maximum(m.sum(1), 1))
  per_row = {"seq_tis": np.minimum(np.exp(log_rho), cap), "geo_tis": np.minimum(geo, cap),
             "geo_reject": ((geo >= bounds[0]) & (geo <= bounds[1])).astype(np.float64)}
  if kind in per_row:
    return np.broadcast_to(per_row[kind][:, None], ratio.shape)
  return {"none": np.ones_like(ratio), "tis": np.minimum(ratio, cap),
          "mis": ((ratio >= 1 / cap) & (ratio <= cap)).astype(np.float64)}[kind]


@pytest.mark.parametrize("importance", losses.IMPORTANCE)
@pytest.mark.parametrize("student_logp", ["learner", "sampler"])
def test_reverse_kl_pg_gradient(data, importance, student_logp):
  bounds = (0.1, 1.2)  # geometric ratios of rows 0 / 1 are 0.03 / 0.15: one rejected, one kept (asserted)
  config = ObjectiveConfig(name="reverse_kl_pg", importance=importance, student_logp=student_logp, is_cap=1.5,
                           geo_lo=bounds[0], geo_hi=bounds[1])
  grad = np.asarray(jax.grad(_loss_of_logits(data, config))(jnp.asarray(data["student"])), np.float64)
  s = data["student"].astype(np.float64)
  m = data["mask"].astype(np.float64)
  lp = _np_token_logp(s, data["tokens"])
  tp = _np_token_logp(data["teacher"], data["tokens"])
  mu = data["sampler_logp"].astype(np.float64)
  advantage = tp - (lp if student_logp == "learner" else mu)
  w = _np_weights(importance, lp - mu, m, 1.5, bounds)
  if importance == "geo_reject":
    assert w[0, 0] != w[1, 0], "the bounds should keep one of rows 0 / 1 and reject the other"
  if importance in losses.SEQUENCE_IMPORTANCE:
    assert np.all(w == w[:, :1]), "a sequence weight is shared by all the response's tokens"
  onehot = np.eye(V)[data["tokens"]]
  expected = -(w * advantage * m)[..., None] * (onehot - np.exp(_np_log_softmax(s))) / m.sum()
  np.testing.assert_allclose(grad, expected, atol=2e-6)


def test_group_advantages_standardize_within_each_prompt():
  reward = jnp.asarray([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])  # two groups of four
  advantage = np.asarray(losses.group_advantages(reward, 4))
  first = np.array([1.0, 0.0, 0.0, 0.0])
  np.testing.assert_allclose(advantage[:4], (first - first.mean()) / (first.std() + 1e-6), rtol=1e-5)
  np.testing.assert_array_equal(advantage[4:], 0.0)  # all correct: no signal


@pytest.mark.parametrize("importance", ["none", "tis"])
def test_grpo_gradient(data, importance):
  config = ObjectiveConfig(name="grpo", importance=importance, is_cap=1.5, group_size=3)
  advantage = np.array([1.2, -0.4, 0.7], np.float32)

  def loss(student_logits):
    learner_logp = token_logprobs(student_logits, jnp.asarray(data["tokens"])) * data["mask"]
    inputs = LossInputs(learner_logp, jnp.asarray(data["sampler_logp"]), jnp.zeros((B, R)), jnp.asarray(data["mask"]),
                        advantage_B=jnp.asarray(advantage))
    return compute_loss(inputs, config)[0]

  grad = np.asarray(jax.grad(loss)(jnp.asarray(data["student"])), np.float64)
  s, m = data["student"].astype(np.float64), data["mask"].astype(np.float64)
  ratio = np.exp(_np_token_logp(s, data["tokens"]) - data["sampler_logp"].astype(np.float64))
  w = np.minimum(ratio, 1.5) if importance == "tis" else np.ones_like(ratio)
  onehot = np.eye(V)[data["tokens"]]
  expected = -(w * advantage[:, None] * m)[..., None] * (onehot - np.exp(_np_log_softmax(s))) / m.sum()
  np.testing.assert_allclose(grad, expected, atol=2e-6)


def test_full_vocabulary_kl_gradients(data):
  s, t, m = (data["student"].astype(np.float64), data["teacher"].astype(np.float64),
             data["mask"].astype(np.float64))
  p, q = np.exp(_np_log_softmax(s)), np.exp(_np_log_softmax(t))
  logp, logq = np.log(p), np.log(q)
  # d KL(p || q) / dz = p * (log p - log q - KL);  d KL(q || p) / dz = p - q.
  kl = (p * (logp - logq)).sum(-1, keepdims=True)
  expected = {"reverse_kl": p * (logp - logq - kl), "forward_kl": p - q}
  for name, gradient in expected.items():
    config = ObjectiveConfig(name=name)
    value = float(_loss_of_logits(data, config)(jnp.asarray(data["student"])))
    per_token = {"reverse_kl": (p * (logp - logq)).sum(-1), "forward_kl": (q * (logq - logp)).sum(-1)}[name]
    np.testing.assert_allclose(value, (per_token * m).sum() / m.sum(), rtol=1e-5)
    grad = np.asarray(jax.grad(_loss_of_logits(data, config))(jnp.asarray(data["student"])))
    np.testing.assert_allclose(grad, gradient * m[..., None] / m.sum(), atol=2e-6)


def _np_jsd(s, t, m, beta, temperature=1.0):
  lp, lq = _np_log_softmax(s / temperature), _np_log_softmax(t / temperature)
  p, q = np.exp(lp), np.exp(lq)
  kl = lambda a, la, lb: (a * (la - lb)).sum(-1)
  if beta == 0:
    per = kl(q, lq, lp)
  elif beta == 1:
    per = kl(p, lp, lq)
  else:
    mix = beta * q + (1 - beta) * p
    per = beta * kl(q, lq, np.log(mix)) + (1 - beta) * kl(p, lp, np.log(mix))
  return (per * m).sum() / m.sum()


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_generalized_jsd_value_and_gradient(data, beta):
  s, t, m = (data["student"].astype(np.float64), data["teacher"].astype(np.float64),
             data["mask"].astype(np.float64))
  value = generalized_jsd(jnp.asarray(data["student"]), jnp.asarray(data["teacher"]), jnp.asarray(data["mask"]),
                          beta, temperature=1.5)
  np.testing.assert_allclose(float(value), _np_jsd(s, t, m, beta, 1.5), rtol=1e-5)
  grad = np.asarray(jax.grad(lambda z: generalized_jsd(z, jnp.asarray(data["teacher"]), jnp.asarray(data["mask"]),
                                                       beta))(jnp.asarray(data["student"])), np.float64)
  eps, numeric = 1e-6, np.zeros_like(s)
  for idx in [(0, 0, 0), (0, 0, 3), (1, 2, 6), (1, 4, 1), (2, 1, 2)]:  # row 2 is fully masked: gradient 0
    plus, minus = s.copy(), s.copy()
    plus[idx] += eps
    minus[idx] -= eps
    numeric[idx] = (_np_jsd(plus, t, m, beta) - _np_jsd(minus, t, m, beta)) / (2 * eps)
    np.testing.assert_allclose(grad[idx], numeric[idx], atol=1e-5)


def test_jsd_endpoints_are_the_two_kls(data):
  args = (jnp.asarray(data["student"]), jnp.asarray(data["teacher"]), jnp.asarray(data["mask"]))
  for beta, name in ((0.0, "forward_kl"), (1.0, "reverse_kl")):
    direct = _loss_of_logits(data, ObjectiveConfig(name=name))(args[0])
    np.testing.assert_allclose(float(generalized_jsd(*args, beta)), float(direct), rtol=1e-6)
  # The mixture branch (log beta, log1p(-beta)) near the endpoints converges to them, scaled by beta or 1 - beta:
  # JSD_beta = beta KL(T||S) + O(beta^2) and (1 - beta) KL(S||T) + O((1 - beta)^2).
  for beta, name in ((1e-4, "forward_kl"), (1 - 1e-4, "reverse_kl")):
    direct = float(_loss_of_logits(data, ObjectiveConfig(name=name))(args[0]))
    scaled = float(generalized_jsd(*args, beta)) / min(beta, 1 - beta)
    np.testing.assert_allclose(scaled, direct, rtol=2e-3)


@pytest.mark.parametrize("name", ["reverse_kl_topk", "forward_kl_topk", "jsd_topk"])
def test_topk_objectives_on_coarse_grained_support(data, name):
  k = 3
  s, t, m = (data["student"].astype(np.float64), data["teacher"].astype(np.float64),
             data["mask"].astype(np.float64))

  def coarse(z, top_ids):
    p = np.exp(_np_log_softmax(z))
    top = np.take_along_axis(p, top_ids, -1)
    return np.concatenate([top, 1 - top.sum(-1, keepdims=True)], -1)

  def np_loss(s_):
    ids = np.argsort(-t, -1)[..., :k]
    p, q = coarse(s_, ids), coarse(t, ids)
    lp, lq = np.log(p), np.log(q)
    kl = lambda a, la, lb: (a * (la - lb)).sum(-1)
    if name == "reverse_kl_topk":
      per = kl(p, lp, lq)
    elif name == "forward_kl_topk":
      per = kl(q, lq, lp)
    else:
      mix = 0.5 * q + 0.5 * p
      per = 0.5 * kl(q, lq, np.log(mix)) + 0.5 * kl(p, lp, np.log(mix))
    return (per * m).sum() / m.sum()

  config = ObjectiveConfig(name=name, top_k=k, beta=0.5)
  f = _loss_of_logits(data, config)
  np.testing.assert_allclose(float(f(jnp.asarray(data["student"]))), np_loss(s), rtol=1e-5)
  grad = np.asarray(jax.grad(f)(jnp.asarray(data["student"])))
  for idx in [(0, 0, 0), (1, 3, 5), (0, 1, 2)]:
    plus, minus = s.copy(), s.copy()
    plus[idx] += 1e-6
    minus[idx] -= 1e-6
    np.testing.assert_allclose(grad[idx], (np_loss(plus) - np_loss(minus)) / 2e-6, atol=1e-5)
  # The coarse-grained divergence never exceeds the full one (data-processing inequality).
  full = _loss_of_logits(data, ObjectiveConfig(name=name.replace("_topk", ""), beta=0.5))
  assert float(f(jnp.asarray(data["student"]))) <= float(full(jnp.asarray(data["student"]))) + 1e-6


def test_objective_config_errors():
  with pytest.raises(ValueError, match="objective.name 'kl' is unknown"):
    ObjectiveConfig(name="kl")
  with pytest.raises(ValueError, match="objective.importance"):
    ObjectiveConfig(importance="ppo")
  with pytest.raises(ValueError, match="objective.student_logp"):
    ObjectiveConfig(student_logp="teacher")
  with pytest.raises(ValueError, match="objective.group_size must be >= 2 for grpo"):
    ObjectiveConfig(name="grpo", group_size=1)
  assert set(losses.OBJECTIVES) >= {"reverse_kl_pg", "reverse_kl", "forward_kl", "jsd", "grpo"}
