"""The optimizer every trainer here uses: AdamW with linear warmup, cosine decay and global-norm clipping."""

from __future__ import annotations

import optax

from opd_jax.errors import InputError


def make_schedule(*, learning_rate: float, warmup_steps: int, total_steps: int,
                  end_lr_fraction: float = 0.1) -> optax.Schedule:
  if total_steps < 1 or warmup_steps < 0 or learning_rate <= 0:
    raise InputError(f"optimizer: need total_steps >= 1, warmup_steps >= 0, learning_rate > 0; got "
                     f"{total_steps}, {warmup_steps}, {learning_rate}")
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=learning_rate, warmup_steps=min(warmup_steps, total_steps - 1),
      decay_steps=total_steps, end_value=learning_rate * end_lr_fraction)


def make_optimizer(schedule: optax.Schedule, *, weight_decay: float, grad_clip_norm: float
                   ) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(grad_clip_norm),
                     optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=weight_decay))
