"""SGLang's room: the `--init-expert-location` map SGLang loads (`expert_map`); its dumps are read by
`traces/sglang_dump.py`. README.md says what SGLang calls and how to check it."""
