"""Test access to a real broker process (see :mod:`api.process`)."""

from api.process import BrokerProcess, free_port

__all__ = ["BrokerProcess", "free_port"]
