"""The stateful model APIs (docs/spec.md §24): files, uploads, batches, conversations, vector
stores, Anthropic message batches and files, each call sent to the backend that holds its
object."""

from gateway.stateful.endpoint import stateful
from gateway.stateful.paths import parse

__all__ = ["parse", "stateful"]
