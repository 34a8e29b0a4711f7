"""Fused kernels for DropIT's selection, compaction and rebuilding.

- :mod:`.cpu`: a C++ / OpenMP extension (``dropit_kernels.cpp``), built once by ``make env``
  (``python -m mmdropit.kernels.cpu.build``) with torch's ``cpp_extension`` and loaded, when it
  matches this torch and these sources, the first time a DropIT layer runs on the CPU.

The kernels are implementations of DropIT's custom operators (:mod:`mmdropit.dropit.ops`): a
layer calls them when they are built and falls back to the eager PyTorch path otherwise (one
warning line says so). Both paths give bit-identical saved tensors.

Not built: Triton kernels for CUDA (the GPU path is the eager one).
"""
