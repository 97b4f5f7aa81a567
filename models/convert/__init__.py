"""Weights published in other formats made into GGUF, without torch: BERT embedding models, PEFT LoRA adapters."""
