"""Helpers that more than one test module uses (test modules never import each other)."""
