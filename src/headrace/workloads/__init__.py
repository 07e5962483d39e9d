"""Synthetic workloads reproducing the papers' input pipelines, generated locally from a seed.

=============  ==============================================================  =====  ========
name           what                                                            batch  workers
=============  ==============================================================  =====  ========
speech-3s      MinatoLoader speech microbenchmark, HeavyStep 3 s × time_scale  24     12
speech-10s     same, HeavyStep 10 s × time_scale                               24     12
imseg          KiTS19-like 3D volumes, heavy-tailed sizes, MLPerf 3D-UNet aug  3      cores(*)
objdet         large OpenImages-like JPEGs, Decode/Resize/Flip/ToTensor/Norm   48     cores(*)
imagenet       small ImageNet-like JPEGs, Decode/RandomResizedCrop/Flip/...    64     cores(*)
=============  ==============================================================  =====  =======

(*) CPU-bound: the usable cores, at most 4 (``workload.cpu_bound_workers``).

``get_workload(name, scale=..., time_scale=...)`` builds one; every workload's ``pipeline`` is
a map-style dataset too. Samples are dicts that carry their ``"index"``.
"""

from headrace.workloads.images import imagenet_workload, objdet_workload
from headrace.workloads.imseg import imseg_workload
from headrace.workloads.jpegs import default_cache_dir
from headrace.workloads.registry import WORKLOADS, base_samples, get_workload
from headrace.workloads.speech import is_heavy, speech_workload
from headrace.workloads.workload import Workload

__all__ = [
    "WORKLOADS",
    "Workload",
    "base_samples",
    "default_cache_dir",
    "get_workload",
    "imagenet_workload",
    "imseg_workload",
    "is_heavy",
    "objdet_workload",
    "speech_workload",
]
