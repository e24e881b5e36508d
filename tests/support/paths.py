"""Where things are, for tests that run scripts, read docs or start fresh interpreters."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
SRC = REPO / "src"
DOCS = REPO / "docs"
SCRIPTS = TESTS / "support" / "scripts"
