"""Following a started run and judging it: the live table, the verdict, the watchdog, GPU telemetry, and the
recovery policy (pure decisions: which failure, and whether another attempt starts)."""
