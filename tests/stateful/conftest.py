from tests.stateful.support import mock_pair

__all__ = ["mock_pair"]
