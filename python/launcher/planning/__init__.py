"""The planner's parts: model parameter counts, the memory model, DeepSpeed configs, the table.

:mod:`launcher.plan` puts them together.
"""

from __future__ import annotations
