"""hwtrace: low-impact, high-detail tracing on Linux."""

__version__ = "0.1.0"


def version() -> str:
    """The installed distribution's version (its metadata), else ``__version__``
    (running from a source tree that was never installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as distribution_version

    try:
        return distribution_version("hwtrace")
    except PackageNotFoundError:
        return __version__
