"""The planner: model parameter counts, hardware, the memory and speed models, DeepSpeed configs, the tables.

:mod:`launcher.planning.training` puts them together: one :class:`~launcher.planning.training.TrainingPlan`
for ``plan: auto`` (every split at the global batch) and for a fixed split (``plan: as_written``, where
``deepspeed: auto`` picks the strategy). Hardware defaults (GPU memory, host RAM, GPUs per node, speeds) live
in :mod:`launcher.planning.hardware`; the safety margin in :mod:`launcher.planning.memory`.
"""

from __future__ import annotations
