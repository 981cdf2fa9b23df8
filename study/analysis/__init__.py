"""The study's analyses: the report and its figures, the validations, the held-out screen, solved sets."""
