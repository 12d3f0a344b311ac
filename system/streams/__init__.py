"""What travels between workers: wire codec, CURVE, shared memory, inference and sample streams."""
