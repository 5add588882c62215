"""DeepSeek's room: `rebalance_experts` with DeepSeek's EPLB signature (`policy`); the greedy itself is an algorithm and
lives in `placement/policies/deepseek.py`. README.md says what DeepSeek's code calls and how to check it."""
