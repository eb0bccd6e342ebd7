"""dfpubsub command-line tools, installed as ``dfpubsub.tools``."""

__all__: list[str] = []
