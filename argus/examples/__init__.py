"""Runnable examples that use the public API (the demo and the tests run them)."""
