"""What a model's settings imply about its layout, without torch (the config checks use it before a run starts)."""


def value_embedding_layers(n_layer: int, enabled: bool) -> list[int]:
    """Alternating layers ending at the last one, or none when value embeddings are off."""
    return [i for i in range(n_layer) if i % 2 == (n_layer - 1) % 2] if enabled else []


# Input channels of the smear gate (nanochat's).
SMEAR_GATE_CHANNELS = 24
