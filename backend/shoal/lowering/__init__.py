"""Lowering of the shoal IR to Polars: the floor between the IR and its users.

``expressions`` turns IR expressions into Polars expressions (``to_polars``) and holds how
Polars runs each function of the IR's table (``FUNCTIONS``); ``infer`` types expressions by
lowering them over an empty frame; ``plan`` lowers plan nodes into one Polars lazy query
(``lower_plan``: what a task runs, and what the plan checks read schemas from), with
``temporal`` for the temporal operators and ``engine`` for the Polars engine that collects.
Both the kernel (``shoal.execution``) and the builder and validator (``shoal.plan``) import
this package; it imports nothing of shoal but the IR and ``errors``.
"""
