"""Embedded task, graders, problem sets."""

from opd_jax.data.grader import extract_answer, gold_answer, is_correct
from opd_jax.data.problems import get_problems, load_jsonl
from opd_jax.data.task import ArithmeticTask, Problem

__all__ = ["ArithmeticTask", "Problem", "extract_answer", "get_problems", "gold_answer", "is_correct",
           "load_jsonl"]
