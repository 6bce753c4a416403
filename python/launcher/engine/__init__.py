"""The engine below the commands: load -> validate -> plan -> ship -> follow -> finish over one run plan.

* :mod:`.load` reads the job spec, training YAML and DeepSpeed JSON once each (and applies the DeepSpeed
rule);
* :mod:`.plan` builds the immutable :class:`~launcher.engine.plan.RunPlan` whose file bytes are validated and
  shipped;
* :mod:`.steps` runs the sequence (preflight through :mod:`launcher.preflight.checks`, the nodes through
  :class:`launcher.backends.runner.PlaybookRunner`);
* :mod:`.finish` ends a run; ``status`` and ``stop`` use it too.

Nothing is imported here, so that a command imports only the steps it needs.
"""

from __future__ import annotations
