"""Harness for demos, benchmarks and tests, never imported by a decode worker: synthetic decode loops over a real
Gloo/NCCL group, the rebalancing loop with injected faults and its summary, and the dense reference a routed layer
must match."""
