"""Solutions to the notebooks' exercises: one module per notebook (``ex02_constraints`` for 02, ...).

Each exercise is a plain function, most of them ``async def f(h, ...)`` taking the notebook's
:class:`agentlab.runtime.harness.Harness`. A notebook's exercise cell imports the solution and runs it; a
learner writes a function with the same signature instead and compares. Every function creates the
rows it needs (its own customers), so it gives the same figures on any database, and returns plain
values read from the database or the provider. ``tests/test_solutions.py`` runs each one on a fresh
database and asserts those values.
"""
