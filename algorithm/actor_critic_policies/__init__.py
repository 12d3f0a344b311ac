"""Actor-critic policies (separate or shared backbone, optional GRU memory)."""
