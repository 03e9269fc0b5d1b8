"""The Hypothesis profiles of the whole suite (tests/conftest.py) apply here too."""
