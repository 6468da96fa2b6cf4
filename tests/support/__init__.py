"""Helpers the test suites share (kernel gates, fixture plugins, peers, waits, hostile servers).

Imported one way only, ``from tests.support.NAME import ...`` (tests/test_support_imports.py checks it).
"""
