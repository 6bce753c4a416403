"""Preflight: every node checked before anything starts (facts, torch stack, the environment the nodes
get)."""
