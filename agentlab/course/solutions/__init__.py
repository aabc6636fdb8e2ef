"""Solutions to the notebooks' exercises: one module per notebook (``ex02_constraints`` for 02, ...).

Each exercise is a plain function, most of them ``async def f(h, ...)`` taking the notebook's
:class:`agentlab.runtime.harness.Harness`. In a notebook, ``await solution("2.1")`` prints the solution and
checks it; a learner writes a function with the same signature instead and checks it with ``check``. Every
function creates the rows it needs (its own customers), so it gives the same figures on any database, and
returns plain values read from the database or the provider. A solution is what a learner reads, so it
imports the kit as a learner does, from ``agentlab`` only (``tests/test_notebook.py``).
``tests/test_solutions.py`` runs each one on a fresh database and asserts those values.

These modules lived in a top-level ``solutions`` package until the course became a layer of its own;
the file ``solutions/ex02_constraints.py`` is now ``agentlab/course/solutions/ex02_constraints.py``.
"""
