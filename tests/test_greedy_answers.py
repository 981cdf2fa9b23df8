"""The probes' grading of greedy answers (study/_greedy_answers.py): "contains" with case and accents ignored."""

from study import _greedy_answers as greedy_answers


def test_plain_drops_case_and_accents():
  assert greedy_answers.plain("Bœuf, Ça Été") == "boeuf, ca ete"


def test_grade_counts_and_keeps_every_answer():
  graded = greedy_answers.grade(["Capital of Peru?", "French for tree?", "Capital of Chad?"],
                                ["Lima", "arbre", "N'Djamena"], ["The capital is LIMA.", "", "Chad"], 1.26)
  assert (graded["correct"], graded["asked"], graded["empty"], graded["seconds"]) == (1, 3, 1, 1.3)
  assert [a["correct"] for a in graded["answers"]] == [True, False, False]
  assert graded["answers"][1] == {"prompt": "French for tree?", "answer": "arbre", "response": "", "correct": False}


def test_grade_matches_accented_answers_written_without_accents():
  graded = greedy_answers.grade(["French for tea?"], ["thé"], ["le the"], 0.0)
  assert graded["correct"] == 1
