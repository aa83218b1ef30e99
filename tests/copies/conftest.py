"""The programs here are data for tests/test_validation.py (the copy check), not tests."""
collect_ignore_glob = ["*.py"]
