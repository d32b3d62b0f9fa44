"""What the trainer (``seal``) and the environments (``env_service``) both need, depending on neither.

* :mod:`seal_shared.types`: the failure-tag vocabulary (``FailureTag``, ``PaperLabel``) and the small
  records and helpers that carry it;
* :mod:`seal_shared.tags`: the failure-tag registry (definitions, evidence rules, weights, guideline
  lines) that an environment's checker tags turns with and the trainer reweights by;
* :mod:`seal_shared.interface`: the episode's half of interface evolution (observation hints, recovery
  hints, guideline rendering, the params blocks), which an environment applies per episode;
* :mod:`seal_shared.plugins`: importing the research plug-in modules that register tags, reweighters
  or environments;
* :mod:`seal_shared.calls`: call strings (``name(k=literal, ...)``), the form tool calls take in
  episodes, checks and logs, read with :mod:`ast` and written back;
* :mod:`seal_shared.held_out`: the guard that lets only a final evaluation read a test split
  (the environments' task stores check it, ``seal eval --split test`` opens its scope).

Dependencies run one way: ``seal -> env_service`` (through its client) and both ``-> seal_shared``.
"""

# The environment client's request timeout (seconds): the client's default and the config's.
DEFAULT_TIMEOUT_S = 60.0
# The environment a config or a service names when it names none: the paper's BFCL.
DEFAULT_ENVIRONMENT = "bfcl"
