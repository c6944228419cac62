"""Hybrid Spark for SGLang."""
__version__ = "0.1.0"
