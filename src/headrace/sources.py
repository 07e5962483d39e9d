"""Public namespace for sources: ``headrace.sources.Files``, ``headrace.sources.DatasetSource``."""

from headrace.pipeline.source import DatasetSource, Files, Source

__all__ = ["DatasetSource", "Files", "Source"]
