"""Model sources: built-in architectures (``zoo``) and the loader for MODEL arguments."""
