"""The local model store, model references, downloads and GGUF reading."""
