"""Helpers of the tests: the rank harness, fake and namespace hosts, scripts."""
