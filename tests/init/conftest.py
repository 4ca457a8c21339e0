from tests.init.simhost import incident

__all__ = ["incident"]
