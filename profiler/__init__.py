"""Graph capture and (later) kernel and collective profiling, emulated clusters."""

from profiler.capture import CaptureOptions, capture_graph

__all__ = ["CaptureOptions", "capture_graph"]
