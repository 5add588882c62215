"""transformers' room: its MoE models' expert blocks made expert-parallel (`models`), and the generation, serving and
summary harness of `scripts/hf_demo.py` (`generation`, `serving`, `summary`). README.md says what is patched and how
to check it."""
