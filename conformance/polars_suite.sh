#!/usr/bin/env bash
# Run Polars' own unit-test suite (pola-rs/polars py-polars/tests/unit) natively and on
# shoal, and report how many tests shoal passes. Not run in CI.
#
#   POLARS_REPO=/path/to/polars.git conformance/polars_suite.sh all
#   conformance/polars_suite.sh --polars-repo /path/to/polars-checkout native
#
# Steps: setup | native | strict | fallback | report | all (see polars_suite.py --help).
# Results go to $POLARS_SUITE_DIR (default ~/.cache/shoal-conformance/polars), never
# into the repository; docs/conformance.md says how the published numbers were made.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$here/polars_suite.py" "$@"
