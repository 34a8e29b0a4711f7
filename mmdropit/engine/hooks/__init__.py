from .memory_report_hook import MemoryReportHook

__all__ = ['MemoryReportHook']
