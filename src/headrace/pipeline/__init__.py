"""WHAT to compute: sources, steps, pipelines, fingerprints, per-sample seeds.

Pure and picklable; imports nothing of headrace but ``errors``.
"""

from headrace.pipeline.code_digest import code_identity
from headrace.pipeline.fingerprint import pipeline_fingerprint, source_fingerprint
from headrace.pipeline.pipeline import LOAD_STEP, Pipeline
from headrace.pipeline.source import DatasetSource, Files, Source
from headrace.pipeline.step import Step, StepKind, step

__all__ = [
    "LOAD_STEP",
    "DatasetSource",
    "Files",
    "Pipeline",
    "Source",
    "Step",
    "StepKind",
    "code_identity",
    "pipeline_fingerprint",
    "source_fingerprint",
    "step",
]
