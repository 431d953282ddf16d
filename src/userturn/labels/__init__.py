"""Labelling user turns: the rules, LLM judges, human annotation, and agreement between them."""
