"""userturn: the user-turn generation probe of interaction awareness in chat models."""

__version__ = "0.1.0"
