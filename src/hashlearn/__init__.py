"""hashlearn: learned hashing and fast similarity search."""

__version__ = "0.1.0"
