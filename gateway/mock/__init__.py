"""The built-in OpenAI-compatible mock backend (see :mod:`gateway.mock.engine`)."""
