"""The policy model: config, locally trained tokenizer, chat/tool-call format, build/save/load."""
