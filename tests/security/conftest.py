"""Hostile scripts against autodl's isolation (issue 19): they need bubblewrap (CI installs it: .ci/bubblewrap.sh);
the sandbox_level fixture is in tests/conftest.py."""
