"""Pool workers: RolloutWorker / TrainWorker actors hosting jobs' phases on a node (RollMux §5.1),
their durable commits, the weight-sync session (§5.2) and the emulated accelerators."""
