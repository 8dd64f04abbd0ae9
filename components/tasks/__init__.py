"""Coding tasks: the on-disk task format, the built-in generator, the data gate."""
