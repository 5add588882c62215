"""TensorRT-LLM's room: its `moe_load_balancer.yaml` (`load_balancer_file`) and its report script's imbalance
(`report`); its expert-statistic dumps are read by `traces/trtllm_statistics.py`. README.md says what TensorRT-LLM
calls and how to check it."""
