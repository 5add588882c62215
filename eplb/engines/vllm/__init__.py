"""vLLM's room: `CpsatEplbPolicy` behind vLLM's EPLB policy interface (`policy`), the plugin that registers it
(`plugin`), vLLM's own default placement for comparison (`default_policy`) and the slot keeping that lets a new map
move as few weights as vLLM's does (`slot_keeping`). README.md says what vLLM calls and how to check it."""
