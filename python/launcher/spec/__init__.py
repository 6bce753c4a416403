"""The job as written: the job spec, the config files it names, the inventory, the node layout, the
repository."""
