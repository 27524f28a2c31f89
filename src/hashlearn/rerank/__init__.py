"""Refinement: exact rescoring of candidates (dense, CSR) and the screens that prune it."""
