"""Tokenize, mix and pack curated documents into self-describing Arrow shards."""
