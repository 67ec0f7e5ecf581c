"""Training engine: configs, optimizer and schedules, losses, checkpoints (the loop comes with the models)."""
