"""Marks p4src/ as the package passing.p4src (pyproject.toml maps it there), so the P4 sources and
the committed P4Info install as its package data; see passing/pipeline_files.py."""
