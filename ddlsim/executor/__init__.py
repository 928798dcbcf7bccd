"""Apply a Strategy to real torch.distributed training and measure it (``run_training``)."""
