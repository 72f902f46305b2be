"""The version of dare-core (one place; the package and the plugin manager read it)."""

__version__ = "0.1.0"
