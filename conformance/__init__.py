"""Tooling that runs other projects' test suites through shoal (not part of the package,
not run in CI): see docs/conformance.md."""
