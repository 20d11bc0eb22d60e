"""Parallelism: the device mesh, process groups, FSDP2 sharding and the zigzag split of windows."""
