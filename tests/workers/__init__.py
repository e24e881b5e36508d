"""The functions the ranks of multi-process tests run (imported by name in every rank)."""
