"""hwtrace: low-impact, high-detail tracing on Linux."""

__version__ = "0.1.0"
