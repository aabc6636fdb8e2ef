"""The nemesis: the faults the lab injects, by family (arguments, database, process, provider, concurrency).

The catalog and its registry are :mod:`agentlab.lab.faults`.
"""
