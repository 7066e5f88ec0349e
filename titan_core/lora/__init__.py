"""[lora]: LoRA adapters through the peft library, named by HF module names; their PEFT export."""
