"""What Lightning and torch lack for DDP image classification."""
