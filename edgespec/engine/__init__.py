"""The speculative decoding engine: takes loaded models, yields events."""
