"""The fixture environments here are data for tests/test_envs.py, not tests: some do not even compile."""
collect_ignore_glob = ["*.py"]
