"""Evaluation and its consequences: held-out accuracy, guards on every output, promotion, lineage and reports."""
