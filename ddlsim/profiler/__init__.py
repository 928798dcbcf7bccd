"""Graph capture, kernel, fusion and collective profiling, batch profiling runs, and the
emulated clusters (network namespaces, shaped links) that distributed runs use."""

from ddlsim.profiler.capture import CaptureOptions, capture_graph

__all__ = ["CaptureOptions", "capture_graph"]
