"""The models training runs: the own decoder and any transformers causal LM behind one interface."""
