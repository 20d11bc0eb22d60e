"""Long-context continued pretraining with ring attention and RoPE scaling."""
