from .dropit_hook import DropITHook
from .memory_report_hook import MemoryReportHook

__all__ = ['DropITHook', 'MemoryReportHook']
