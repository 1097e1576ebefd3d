"""The tileplan version (one place: the package, the CLI and the reports read it)."""

__version__ = "0.3.0"
