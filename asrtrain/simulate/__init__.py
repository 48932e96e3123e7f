"""A cluster simulator for 16-256 learners on one machine (issue 14): the real model, data and
task, the backends' averaging arithmetic and gossip schedules, and simulated time from a speed
model. :mod:`.engine` runs it, :mod:`.timing` says when steps and gossip rounds happen,
:mod:`.speeds` how fast each learner is, :mod:`.workload` builds a recipe's task for it, and
:mod:`.command` is ``asrtrain simulate``. docs/science.md says what it has been used for.
"""
