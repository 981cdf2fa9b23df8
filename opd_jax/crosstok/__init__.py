"""Cross-tokenizer OPD: a teacher with its own tokenizer and prompt format scores the student's sampled text exactly,
span by span (align: the spans; formats: the teacher's prompt; view: a batch as the teacher reads it; scoring: the
teacher's span log-probs and the held-out span KL)."""
