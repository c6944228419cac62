"""SGLang glue: registration, host-API declarations, the HYBRID_SPARK workers."""
