"""flowyard: an integration flow service."""

__version__ = "0.1.0"
