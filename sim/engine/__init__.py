"""The request-level run of the serving cluster (SimPy): requests through a vision stage, prefill nodes with KV cache
tiers, and decode EP units whose imbalance comes from the placement code; its report and figures."""
