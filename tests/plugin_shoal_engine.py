"""pytest plugin: run a test module's plain Polars queries on shoal (``--shoal-engine``).

The plugin lives in :mod:`conformance.shoal_pytest_plugin`, which also runs Polars' own
unit-test suite on shoal (``conformance/polars_suite.sh``); this module re-exports its hooks
and fixture under the name shoal's tests register (``tests/conftest.py``)::

    pytest -p tests.plugin_shoal_engine --shoal-engine tests/test_polars_conformance.py
"""

from conformance.shoal_pytest_plugin import (  # noqa: F401
    SCAN_PARTITION_BYTES,
    _shoal_engine,
    pytest_addoption,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_protocol,
    pytest_terminal_summary,
)
