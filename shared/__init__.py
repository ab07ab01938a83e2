"""What crosses process lines: configs, sampling parameters, outputs and the step protocol.

Nothing here imports from frontend/, scheduler/, executor/ or kernels/, and nothing here
imports torch: the scheduler process loads this package too.
"""
