"""Lowering of the shoal IR to Polars: the floor between the IR and its users.

``expressions`` turns IR expressions into Polars expressions (``to_polars``) and holds the
table of functions the kernel runs (``FUNCTIONS``); ``infer`` types expressions by lowering
them over an empty frame. Both the kernel (``shoal.execution``) and the builder and
validator (``shoal.plan``) import this package; it imports nothing of shoal but the IR and
``errors``.
"""
