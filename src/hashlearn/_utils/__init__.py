"""Shared private primitives: argument checks, threads, popcount, posting lists, kernel helpers."""
