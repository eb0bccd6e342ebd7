"""dfpubsub daemons, installed as ``dfpubsub.services``."""

__all__: list[str] = []
