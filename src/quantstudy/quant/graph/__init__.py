"""Reading and editing a module graph: which module reads which tensor in one traced forward
pass, hooks, and module replacement. No quantization here, so every stage above can use it."""
