"""Files shipped to the nodes (the agent, its contract, the probe) and data read by the launcher."""

from __future__ import annotations
