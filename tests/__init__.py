"""The test suite runs from a checkout: REPO is its root (docs/, scripts/, the Makefile)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
