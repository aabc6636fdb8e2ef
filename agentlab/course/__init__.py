"""The course: the notebooks' exercises, their checks (:mod:`agentlab.course.exercises`) and the reference
solutions (:mod:`agentlab.course.solutions`), above the lab and the demos they exercise."""
