"""Helpers every test folder shares: one ``free_port``, one ``wait_until``.

Test modules import helpers from here (or from a conftest.py's fixtures), never from another
``test_*.py`` file: a test module is a list of tests, and the parallel layout (pytest-xdist, one
control plane per worker) has one place to change.
"""
