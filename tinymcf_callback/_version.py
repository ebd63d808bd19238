"""The package's version, in one place (the package, the command's --version and every report read it)."""

__version__ = "0.1.0"
