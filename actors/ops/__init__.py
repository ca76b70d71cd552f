"""Operations: the ``rollmux`` cluster commands, local clusters, metrics, process statistics."""
