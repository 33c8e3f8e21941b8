"""Operator tools: the ``breaker-redis`` command line, ``doctor`` and the reader
that status, metrics and the dashboard share.
"""
