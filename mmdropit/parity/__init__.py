"""The accuracy-parity suite: DropIT at several gammas against the baseline, over seeds, on
real data (``tools/parity.py``)."""
from .job import METRICS, ParityJob, job_config, run_job, with_gamma
from .summary import TOLERANCE, markdown_table, plot_parity, summarize

__all__ = ['METRICS', 'ParityJob', 'TOLERANCE', 'job_config', 'markdown_table', 'plot_parity',
           'run_job', 'summarize', 'with_gamma']
